//! Change streams through the real driver.

mod common;

use std::time::Duration;

use common::{bounded, next_event, server_code, setup};
use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::OperationType;
use mongodb::options::{
    ChangeStreamPreAndPostImages, FullDocumentBeforeChangeType, FullDocumentType,
};

#[tokio::test]
async fn watch_sees_insert_update_replace_delete_in_order() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut stream = coll
            .watch()
            .full_document(FullDocumentType::UpdateLookup)
            .await
            .expect("watch");

        coll.insert_one(doc! {"_id": 1, "a": 1, "b": 1})
            .await
            .expect("insert");
        coll.update_one(
            doc! {"_id": 1},
            doc! {"$set": {"a": 2}, "$unset": {"b": ""}},
        )
        .await
        .expect("update");
        coll.replace_one(doc! {"_id": 1}, doc! {"r": true})
            .await
            .expect("replace");
        coll.delete_one(doc! {"_id": 1}).await.expect("delete");

        let ins = next_event(&mut stream).await;
        assert_eq!(ins.operation_type, OperationType::Insert);
        assert_eq!(ins.full_document, Some(doc! {"_id": 1, "a": 1, "b": 1}));
        assert_eq!(ins.document_key, Some(doc! {"_id": 1}));
        let ns = ins.ns.as_ref().expect("ns");
        assert_eq!((ns.db.as_str(), ns.coll.as_deref()), ("d", Some("c")));
        assert!(ins.cluster_time.is_some() && ins.wall_time.is_some());

        let upd = next_event(&mut stream).await;
        assert_eq!(upd.operation_type, OperationType::Update);
        let desc = upd.update_description.as_ref().expect("updateDescription");
        assert_eq!(desc.updated_fields, doc! {"a": 2});
        assert_eq!(desc.removed_fields, vec!["b".to_string()]);
        assert_eq!(desc.truncated_arrays.as_ref().map(Vec::len), Some(0));
        // updateLookup reads the document as it is now (already replaced, then deleted: null).
        assert_eq!(upd.full_document, None);

        let rep = next_event(&mut stream).await;
        assert_eq!(rep.operation_type, OperationType::Replace);
        assert_eq!(rep.full_document, Some(doc! {"_id": 1, "r": true}));

        let del = next_event(&mut stream).await;
        assert_eq!(del.operation_type, OperationType::Delete);
        assert_eq!(del.document_key, Some(doc! {"_id": 1}));
        assert!(del.full_document.is_none());

        let tokens: Vec<String> = [&ins, &upd, &rep, &del]
            .iter()
            .map(|e| {
                let raw = mongodb::bson::to_document(&e.id).expect("token is a document");
                raw.get_str("_data").expect("_data").to_string()
            })
            .collect();
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens ordered: {tokens:?}"
        );
        assert!(tokens.iter().all(|t| *t == t.to_uppercase()));
    })
    .await;
}

#[tokio::test]
async fn update_lookup_returns_the_current_document() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut stream = coll
            .watch()
            .full_document(FullDocumentType::UpdateLookup)
            .await
            .expect("watch");
        coll.insert_one(doc! {"_id": 1, "n": 0})
            .await
            .expect("insert");
        coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .await
            .expect("update");
        next_event(&mut stream).await;
        let upd = next_event(&mut stream).await;
        assert_eq!(upd.full_document, Some(doc! {"_id": 1, "n": 1}));
    })
    .await;
}

#[tokio::test]
async fn pre_and_post_images_when_enabled() {
    bounded(async {
        let (_emu, client) = setup().await;
        let db = client.database("d");
        db.create_collection("img")
            .change_stream_pre_and_post_images(
                ChangeStreamPreAndPostImages::builder()
                    .enabled(true)
                    .build(),
            )
            .await
            .expect("create with images");
        let with = db.collection::<Document>("img");
        let without = db.collection::<Document>("plain");
        let mut s1 = with
            .watch()
            .full_document(FullDocumentType::WhenAvailable)
            .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
            .await
            .expect("watch");
        let mut s2 = without
            .watch()
            .full_document(FullDocumentType::WhenAvailable)
            .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
            .await
            .expect("watch");
        for coll in [&with, &without] {
            coll.insert_one(doc! {"_id": 1, "v": 1})
                .await
                .expect("insert");
            coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}})
                .await
                .expect("update");
            coll.delete_one(doc! {"_id": 1}).await.expect("delete");
        }
        next_event(&mut s1).await;
        let upd = next_event(&mut s1).await;
        assert_eq!(upd.full_document, Some(doc! {"_id": 1, "v": 2}));
        assert_eq!(
            upd.full_document_before_change,
            Some(doc! {"_id": 1, "v": 1})
        );
        let del = next_event(&mut s1).await;
        assert_eq!(
            del.full_document_before_change,
            Some(doc! {"_id": 1, "v": 2})
        );

        next_event(&mut s2).await;
        let upd = next_event(&mut s2).await;
        assert_eq!(upd.full_document, None);
        assert_eq!(upd.full_document_before_change, None);

        without.insert_one(doc! {"_id": 2}).await.expect("insert");
        let mut s3 = without
            .watch()
            .full_document_before_change(FullDocumentBeforeChangeType::Required)
            .await
            .expect("watch");
        without.delete_one(doc! {"_id": 2}).await.expect("delete");
        let err = tokio::time::timeout(Duration::from_secs(10), s3.next())
            .await
            .expect("in time")
            .expect("an item")
            .expect_err("required pre-image missing");
        assert_eq!(server_code(&err), Some(47), "{err}");
    })
    .await;
}

#[tokio::test]
async fn resume_after_gives_exactly_the_later_events() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut stream = coll.watch().await.expect("watch");
        for i in 0..5 {
            coll.insert_one(doc! {"_id": i}).await.expect("insert");
        }
        let mut token = None;
        for i in 0..2 {
            let ev = next_event(&mut stream).await;
            assert_eq!(ev.document_key, Some(doc! {"_id": i}));
            token = Some(ev.id);
        }
        drop(stream);
        let mut resumed = coll
            .watch()
            .resume_after(token.expect("token"))
            .await
            .expect("resume");
        for i in 2..5 {
            assert_eq!(
                next_event(&mut resumed).await.document_key,
                Some(doc! {"_id": i})
            );
        }
        coll.insert_one(doc! {"_id": 5}).await.expect("insert");
        assert_eq!(
            next_event(&mut resumed).await.document_key,
            Some(doc! {"_id": 5})
        );
    })
    .await;
}

#[tokio::test]
async fn start_at_operation_time_includes_that_time() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": "before"})
            .await
            .expect("insert");
        let mut s = coll.watch().await.expect("watch");
        coll.insert_one(doc! {"_id": "marker"})
            .await
            .expect("insert");
        let marker = next_event(&mut s).await;
        coll.insert_one(doc! {"_id": "after"})
            .await
            .expect("insert");
        drop(s);
        let ts = marker.cluster_time.expect("clusterTime");
        let mut from = coll
            .watch()
            .start_at_operation_time(ts)
            .await
            .expect("watch at time");
        assert_eq!(
            next_event(&mut from).await.document_key,
            Some(doc! {"_id": "marker"})
        );
        assert_eq!(
            next_event(&mut from).await.document_key,
            Some(doc! {"_id": "after"})
        );
    })
    .await;
}

#[tokio::test]
async fn history_lost_is_286_and_non_resumable() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll.watch().await.expect("watch");
        coll.insert_one(doc! {"_id": 1}).await.expect("insert");
        let first = next_event(&mut s).await;
        drop(s);
        coll.insert_one(doc! {"_id": 2}).await.expect("insert");
        let token_doc = mongodb::bson::to_document(&first.id).expect("token");
        emu.truncate_oplog_through(&token_doc).expect("truncate");
        let err = coll
            .watch()
            .resume_after(first.id.clone())
            .await
            .expect_err("history lost");
        assert_eq!(server_code(&err), Some(286), "{err}");
        assert!(err.contains_label("NonResumableChangeStreamError"), "{err}");
        assert!(
            err.to_string().contains("may no longer be in the oplog"),
            "{err}"
        );

        let err = coll
            .watch()
            .start_at_operation_time(first.cluster_time.expect("time"))
            .await
            .expect_err("history lost");
        assert_eq!(server_code(&err), Some(286), "{err}");
    })
    .await;
}

#[tokio::test]
async fn bounded_oplog_loses_history_on_its_own() {
    bounded(async {
        let emu = mongo_emulator::Emulator::start_with(mongo_emulator::EmulatorOptions {
            oplog_capacity: 5,
            ..Default::default()
        })
        .await
        .expect("start");
        let client = common::client_for(&emu.uri()).await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll.watch().await.expect("watch");
        coll.insert_one(doc! {"_id": 0}).await.expect("insert");
        let first = next_event(&mut s).await;
        drop(s);
        coll.insert_many((1..10).map(|i| doc! {"_id": i}))
            .await
            .expect("insert");
        assert_eq!(emu.oplog_len(), 5);
        let err = coll
            .watch()
            .resume_after(first.id)
            .await
            .expect_err("history lost");
        assert_eq!(server_code(&err), Some(286), "{err}");
    })
    .await;
}

#[tokio::test]
async fn never_issued_or_malformed_tokens_are_refused() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let fake: mongodb::change_stream::event::ResumeToken = mongodb::bson::from_document(
            doc! {"_data": format!("82{:08X}{:08X}{:016X}00{:04X}", 1, 1, 999_999u64, 0)},
        )
        .expect("token");
        let err = coll
            .watch()
            .resume_after(fake)
            .await
            .expect_err("never issued");
        assert_eq!(server_code(&err), Some(260), "{err}");
        let junk: mongodb::change_stream::event::ResumeToken =
            mongodb::bson::from_document(doc! {"_data": "not hex"}).expect("token");
        let err = coll
            .watch()
            .resume_after(junk)
            .await
            .expect_err("malformed");
        assert_eq!(server_code(&err), Some(9), "{err}");
    })
    .await;
}

#[tokio::test]
async fn drop_invalidates_and_start_after_the_invalidate_works() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 0}).await.expect("insert");
        let mut s = coll.watch().await.expect("watch");
        coll.drop().await.expect("drop");
        let drop_ev = next_event(&mut s).await;
        assert_eq!(drop_ev.operation_type, OperationType::Drop);
        let inv = next_event(&mut s).await;
        assert_eq!(inv.operation_type, OperationType::Invalidate);
        let end = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("ends in time");
        assert!(end.is_none(), "stream ends after invalidate");
        assert!(!s.is_alive());
        assert_eq!(emu.open_cursors(), 0);

        coll.insert_one(doc! {"_id": "recreated"})
            .await
            .expect("insert");
        let mut after = coll
            .watch()
            .start_after(inv.id.clone())
            .await
            .expect("start_after invalidate");
        assert_eq!(
            next_event(&mut after).await.document_key,
            Some(doc! {"_id": "recreated"})
        );

        let err = coll
            .watch()
            .resume_after(inv.id.clone())
            .await
            .expect_err("resume_after invalidate");
        assert_eq!(server_code(&err), Some(260), "{err}");
        assert!(
            err.to_string()
                .contains("not allowed from an invalidate notification"),
            "{err}"
        );
        assert!(!err.contains_label("NonResumableChangeStreamError"));

        // Resuming from the drop's own token delivers the invalidate again.
        let mut again = coll
            .watch()
            .resume_after(drop_ev.id)
            .await
            .expect("resume after drop");
        assert_eq!(
            next_event(&mut again).await.operation_type,
            OperationType::Invalidate
        );
    })
    .await;
}

#[tokio::test]
async fn rename_emits_rename_then_invalidate() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("from");
        coll.insert_one(doc! {"_id": 1}).await.expect("insert");
        let mut s = coll.watch().await.expect("watch");
        client
            .database("admin")
            .run_command(doc! {"renameCollection": "d.from", "to": "d.to"})
            .await
            .expect("rename");
        let ev = next_event(&mut s).await;
        assert_eq!(ev.operation_type, OperationType::Rename);
        let to = ev.to.expect("to");
        assert_eq!((to.db.as_str(), to.coll.as_deref()), ("d", Some("to")));
        assert_eq!(
            next_event(&mut s).await.operation_type,
            OperationType::Invalidate
        );
    })
    .await;
}

#[tokio::test]
async fn database_and_cluster_streams() {
    bounded(async {
        let (_emu, client) = setup().await;
        let db = client.database("d");
        let mut dbs = db.watch().await.expect("db watch");
        let mut all = client.watch().await.expect("cluster watch");
        db.collection::<Document>("a")
            .insert_one(doc! {"_id": 1})
            .await
            .expect("insert");
        client
            .database("other")
            .collection::<Document>("b")
            .insert_one(doc! {"_id": 2})
            .await
            .expect("insert");
        db.collection::<Document>("b")
            .insert_one(doc! {"_id": 3})
            .await
            .expect("insert");
        db.drop().await.expect("dropDatabase");

        let mut seen = Vec::new();
        loop {
            let ev = next_event(&mut dbs).await;
            let op = ev.operation_type.clone();
            seen.push((op.clone(), ev.ns.and_then(|n| n.coll)));
            if op == OperationType::Invalidate {
                break;
            }
        }
        assert_eq!(
            seen,
            vec![
                (OperationType::Insert, Some("a".to_string())),
                (OperationType::Insert, Some("b".to_string())),
                (OperationType::Drop, Some("a".to_string())),
                (OperationType::Drop, Some("b".to_string())),
                (OperationType::DropDatabase, None),
                (OperationType::Invalidate, None),
            ]
        );
        for id in [1, 2, 3] {
            assert_eq!(
                next_event(&mut all).await.document_key,
                Some(doc! {"_id": id})
            );
        }
        assert_eq!(
            next_event(&mut all).await.operation_type,
            OperationType::Drop
        );
        assert_eq!(
            next_event(&mut all).await.operation_type,
            OperationType::Drop
        );
        assert_eq!(
            next_event(&mut all).await.operation_type,
            OperationType::DropDatabase
        );
        assert!(
            all.is_alive(),
            "cluster streams are not invalidated by dropDatabase"
        );
    })
    .await;
}

#[tokio::test]
async fn match_and_project_stages_apply_to_events() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll
            .watch()
            .pipeline(vec![
                doc! {"$match": {"operationType": "insert", "fullDocument.keep": true}},
                doc! {"$project": {"fullDocument.secret": 0}},
            ])
            .await
            .expect("watch");
        coll.insert_one(doc! {"_id": 1, "keep": false})
            .await
            .expect("insert");
        coll.insert_one(doc! {"_id": 2, "keep": true, "secret": "s"})
            .await
            .expect("insert");
        coll.delete_one(doc! {"_id": 2}).await.expect("delete");
        coll.insert_one(doc! {"_id": 3, "keep": true})
            .await
            .expect("insert");
        let a = next_event(&mut s).await;
        assert_eq!(a.full_document, Some(doc! {"_id": 2, "keep": true}));
        let b = next_event(&mut s).await;
        assert_eq!(b.document_key, Some(doc! {"_id": 3}));

        let err = coll
            .watch()
            .pipeline(vec![doc! {"$group": {"_id": 1}}])
            .await
            .expect_err("bad stage");
        assert!(server_code(&err).is_some(), "{err}");
        let split = coll
            .watch()
            .pipeline(vec![doc! {"$changeStreamSplitLargeEvent": {}}])
            .await;
        assert!(split.is_ok(), "split stage accepted as the last stage");
    })
    .await;
}

#[tokio::test]
async fn idle_stream_returns_none_and_a_post_batch_token() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let other = client.database("d").collection::<Document>("other");
        let mut s = coll
            .watch()
            .max_await_time(Duration::from_millis(50))
            .await
            .expect("watch");
        let initial = s
            .resume_token()
            .expect("a post-batch token from the first batch");
        assert!(s.next_if_any().await.expect("no error").is_none());
        // Writes elsewhere advance the quiet stream's token.
        other
            .insert_many((0..3).map(|i| doc! {"_id": i}))
            .await
            .expect("insert");
        assert!(s.next_if_any().await.expect("no error").is_none());
        let advanced = s.resume_token().expect("token");
        let data = |t: &mongodb::change_stream::event::ResumeToken| {
            mongodb::bson::to_document(t)
                .expect("doc")
                .get_str("_data")
                .expect("_data")
                .to_string()
        };
        assert!(
            data(&advanced) > data(&initial),
            "{} > {}",
            data(&advanced),
            data(&initial)
        );
        assert_eq!(
            mongodb::bson::to_document(&advanced).expect("doc"),
            emu.head_resume_token()
        );
        coll.insert_one(doc! {"_id": "later"})
            .await
            .expect("insert");
        drop(s);
        let mut resumed = coll.watch().resume_after(advanced).await.expect("resume");
        let ev = next_event(&mut resumed).await;
        assert_eq!(ev.document_key, Some(doc! {"_id": "later"}));
        assert_eq!(
            ev.full_document.and_then(|d| d.get("_id").cloned()),
            Some(Bson::String("later".into()))
        );
    })
    .await;
}

#[tokio::test]
async fn large_events_split_into_fragments_or_fail_with_10334() {
    bounded(async {
        let (_emu, client) = setup().await;
        let db = client.database("d");
        db.create_collection("big")
            .change_stream_pre_and_post_images(
                ChangeStreamPreAndPostImages::builder()
                    .enabled(true)
                    .build(),
            )
            .await
            .expect("create with images");
        let coll = db.collection::<Document>("big");
        coll.insert_one(doc! {"_id": 1, "blob": "x".repeat(9 * 1024 * 1024), "n": 0})
            .await
            .expect("insert 9 MB");
        let open = |split: bool| {
            let coll = coll.clone();
            async move {
                let pipeline = if split {
                    vec![doc! {"$changeStreamSplitLargeEvent": {}}]
                } else {
                    vec![]
                };
                coll.watch()
                    .pipeline(pipeline)
                    .full_document(FullDocumentType::WhenAvailable)
                    .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
                    .await
                    .expect("watch")
                    .with_type::<Document>()
            }
        };
        let mut split = open(true).await;
        let mut whole = open(false).await;
        coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .await
            .expect("update");

        let first = next_raw(&mut split).await.expect("fragment 1");
        assert_eq!(
            first.get_document("splitEvent").expect("splitEvent"),
            &doc! {"fragment": 1, "of": 2}
        );
        assert_eq!(first.get_str("operationType"), Ok("update"));
        assert!(
            first.contains_key("fullDocument") && !first.contains_key("fullDocumentBeforeChange")
        );
        let second = next_raw(&mut split).await.expect("fragment 2");
        assert_eq!(
            second.get_document("splitEvent").expect("splitEvent"),
            &doc! {"fragment": 2, "of": 2}
        );
        assert!(second.contains_key("fullDocumentBeforeChange"));
        assert_ne!(first.get("_id"), second.get("_id"));

        // Resuming from the first fragment's token restarts at the second fragment.
        let token: mongodb::change_stream::event::ResumeToken =
            mongodb::bson::from_bson(first.get("_id").cloned().expect("_id")).expect("token");
        drop(split);
        let mut resumed = coll
            .watch()
            .pipeline(vec![doc! {"$changeStreamSplitLargeEvent": {}}])
            .full_document(FullDocumentType::WhenAvailable)
            .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
            .resume_after(token)
            .await
            .expect("resume from fragment")
            .with_type::<Document>();
        let again = next_raw(&mut resumed).await.expect("fragment 2 again");
        assert_eq!(
            again.get_document("splitEvent").expect("splitEvent"),
            &doc! {"fragment": 2, "of": 2}
        );

        let err = next_raw(&mut whole)
            .await
            .expect_err("too large without the split stage");
        assert_eq!(server_code(&err), Some(10334), "{err}");
    })
    .await;
}

async fn next_raw(
    s: &mut mongodb::change_stream::ChangeStream<Document>,
) -> mongodb::error::Result<Document> {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("in time")
        .expect("open")
}
