//! CRUD through the real driver.

mod common;

use common::{bounded, client_for, server_code, setup};
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{IndexOptions, ReturnDocument};
use mongodb::IndexModel;

#[tokio::test]
async fn insert_and_find_with_filter_sort_limit_skip_projection() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("shop").collection::<Document>("items");
        let docs: Vec<Document> = (0..20)
            .map(|i| doc! {"_id": i, "n": i, "kind": if i % 2 == 0 { "even" } else { "odd" }, "tags": ["a", format!("t{i}")], "sub": {"v": i * 10}})
            .collect();
        let res = coll.insert_many(docs).await.expect("insert_many");
        assert_eq!(res.inserted_ids.len(), 20);

        let found: Vec<Document> = coll
            .find(doc! {"kind": "even", "n": {"$gte": 4}})
            .sort(doc! {"n": -1})
            .skip(1)
            .limit(3)
            .projection(doc! {"n": 1, "_id": 0})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("collect");
        assert_eq!(found, vec![doc! {"n": 16}, doc! {"n": 14}, doc! {"n": 12}]);

        let by_tag = coll.find_one(doc! {"tags": "t7"}).await.expect("find_one");
        assert_eq!(by_tag.and_then(|d| d.get_i32("n").ok()), Some(7));
        let by_sub = coll.count_documents(doc! {"sub.v": {"$in": [30, 40, 999]}}).await.expect("count");
        assert_eq!(by_sub, 2);
        let none = coll.find_one(doc! {"n": {"$gt": 100}}).await.expect("find_one");
        assert!(none.is_none());
        let or = coll.count_documents(doc! {"$or": [{"n": 1}, {"n": {"$lt": 0}}, {"kind": "none"}]}).await.expect("count");
        assert_eq!(or, 1);
    })
    .await;
}

#[tokio::test]
async fn find_batches_use_get_more() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_many((0..250).map(|i| doc! {"_id": i}))
            .await
            .expect("insert");
        let all: Vec<Document> = coll
            .find(doc! {})
            .batch_size(10)
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("collect");
        assert_eq!(all.len(), 250);
        assert_eq!(all[249].get_i32("_id"), Ok(249));
        assert!(
            emu.command_count("getMore") >= 24,
            "getMore count {}",
            emu.command_count("getMore")
        );
        assert_eq!(emu.open_cursors(), 0);
    })
    .await;
}

#[tokio::test]
async fn update_operators_and_upsert() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 1, "a": 1, "hi": 5, "lo": 5, "gone": true}).await.expect("insert");

        let r = coll
            .update_one(
                doc! {"_id": 1},
                doc! {"$set": {"b.c": "x"}, "$inc": {"a": 2}, "$max": {"hi": 9}, "$min": {"lo": 1}, "$unset": {"gone": ""}, "$setOnInsert": {"never": 1}},
            )
            .await
            .expect("update");
        assert_eq!((r.matched_count, r.modified_count), (1, 1));
        let d = coll.find_one(doc! {"_id": 1}).await.expect("find").expect("exists");
        assert_eq!(d, doc! {"_id": 1, "a": 3, "hi": 9, "lo": 1, "b": {"c": "x"}});

        let same = coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 3}}).await.expect("update");
        assert_eq!((same.matched_count, same.modified_count), (1, 0));

        let up = coll
            .update_one(doc! {"key": "k1"}, doc! {"$set": {"v": 1}, "$setOnInsert": {"created": true}})
            .upsert(true)
            .await
            .expect("upsert");
        assert_eq!(up.matched_count, 0);
        let id = up.upserted_id.expect("upserted id");
        let d = coll.find_one(doc! {"_id": id}).await.expect("find").expect("exists");
        assert_eq!(d.get_str("key"), Ok("k1"));
        assert_eq!(d.get_bool("created"), Ok(true));

        coll.insert_many(vec![doc! {"g": 1}, doc! {"g": 1}, doc! {"g": 2}]).await.expect("insert");
        let many = coll.update_many(doc! {"g": 1}, doc! {"$inc": {"n": 1}}).await.expect("update_many");
        assert_eq!((many.matched_count, many.modified_count), (2, 2));

        let err = coll.update_one(doc! {"_id": 1}, doc! {"$push": {"a": 1}}).await.expect_err("unknown operator");
        assert!(server_code(&err).is_some(), "{err}");
        let err = coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"b": 1}}).await.expect_err("inc on a document");
        assert_eq!(server_code(&err), Some(14), "{err}");
    })
    .await;
}

#[tokio::test]
async fn replace_and_delete() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_many((0..5).map(|i| doc! {"_id": i, "k": i % 2}))
            .await
            .expect("insert");
        let r = coll
            .replace_one(doc! {"_id": 2}, doc! {"new": "shape"})
            .await
            .expect("replace");
        assert_eq!(r.modified_count, 1);
        assert_eq!(
            coll.find_one(doc! {"_id": 2}).await.expect("find"),
            Some(doc! {"_id": 2, "new": "shape"})
        );
        let up = coll
            .replace_one(doc! {"_id": 42}, doc! {"x": 1})
            .upsert(true)
            .await
            .expect("replace upsert");
        assert_eq!(up.upserted_id, Some(Bson::Int32(42)));

        let one = coll.delete_one(doc! {"k": 1}).await.expect("delete_one");
        assert_eq!(one.deleted_count, 1);
        let many = coll
            .delete_many(doc! {"k": {"$exists": true}})
            .await
            .expect("delete_many");
        assert_eq!(many.deleted_count, 3);
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 2);
    })
    .await;
}

#[tokio::test]
async fn find_and_modify_variants() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("jobs");
        coll.insert_many(vec![
            doc! {"_id": 1, "p": 5, "state": "new"},
            doc! {"_id": 2, "p": 9, "state": "new"},
        ])
        .await
        .expect("insert");
        let before = coll
            .find_one_and_update(doc! {"state": "new"}, doc! {"$set": {"state": "taken"}})
            .sort(doc! {"p": -1})
            .await
            .expect("fam")
            .expect("a document");
        assert_eq!(before, doc! {"_id": 2, "p": 9, "state": "new"});
        let after = coll
            .find_one_and_update(doc! {"state": "new"}, doc! {"$inc": {"p": 1}})
            .return_document(ReturnDocument::After)
            .projection(doc! {"p": 1})
            .await
            .expect("fam")
            .expect("a document");
        assert_eq!(after, doc! {"_id": 1, "p": 6});
        let upserted = coll
            .find_one_and_update(doc! {"_id": 3}, doc! {"$set": {"state": "new"}})
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .expect("fam upsert");
        assert_eq!(upserted, Some(doc! {"_id": 3, "state": "new"}));
        let removed = coll
            .find_one_and_delete(doc! {"_id": 1})
            .await
            .expect("fam delete");
        assert_eq!(removed.and_then(|d| d.get_i32("p").ok()), Some(6));
        let replaced = coll
            .find_one_and_replace(doc! {"_id": 2}, doc! {"r": true})
            .return_document(ReturnDocument::After)
            .await
            .expect("fam replace");
        assert_eq!(replaced, Some(doc! {"_id": 2, "r": true}));
        assert!(coll
            .find_one_and_delete(doc! {"_id": 99})
            .await
            .expect("fam")
            .is_none());
    })
    .await;
}

#[tokio::test]
async fn count_documents_goes_through_aggregate() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_many((0..30).map(|i| doc! {"i": i}))
            .await
            .expect("insert");
        emu.reset_command_counts();
        assert_eq!(
            coll.count_documents(doc! {"i": {"$lt": 10}})
                .await
                .expect("count"),
            10
        );
        assert_eq!(emu.command_count("aggregate"), 1);
        assert_eq!(
            coll.count_documents(doc! {})
                .skip(5)
                .limit(100)
                .await
                .expect("count"),
            25
        );
        assert_eq!(
            coll.count_documents(doc! {"i": -1}).await.expect("count"),
            0
        );
        assert_eq!(coll.estimated_document_count().await.expect("estimate"), 30);
    })
    .await;
}

#[tokio::test]
async fn unique_index_violation_is_e11000() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("users");
        let model = IndexModel::builder()
            .keys(doc! {"email": 1})
            .options(
                IndexOptions::builder()
                    .unique(true)
                    .name("email_1".to_string())
                    .build(),
            )
            .build();
        coll.create_index(model).await.expect("create index");
        let ttl = IndexModel::builder()
            .keys(doc! {"at": 1})
            .options(
                IndexOptions::builder()
                    .expire_after(std::time::Duration::from_secs(60))
                    .build(),
            )
            .build();
        coll.create_index(ttl).await.expect("ttl index accepted");
        let names = coll.list_index_names().await.expect("list indexes");
        assert!(
            names.contains(&"email_1".to_string()) && names.contains(&"_id_".to_string()),
            "{names:?}"
        );

        coll.insert_one(doc! {"email": "a@x"})
            .await
            .expect("first insert");
        let err = coll
            .insert_one(doc! {"email": "a@x"})
            .await
            .expect_err("duplicate");
        assert_eq!(server_code(&err), Some(11000), "{err}");
        assert!(err.to_string().contains("E11000"), "{err}");
        let err = coll
            .insert_many(vec![doc! {"email": "b@x"}, doc! {"email": "b@x"}])
            .await
            .expect_err("dup in batch");
        assert_eq!(server_code(&err), Some(11000), "{err}");
        let err = coll
            .insert_one(doc! {"_id": 1})
            .await
            .and(coll.insert_one(doc! {"_id": 1}).await)
            .expect_err("dup _id");
        assert_eq!(server_code(&err), Some(11000));
        assert_eq!(
            coll.count_documents(doc! {"email": "b@x"})
                .await
                .expect("count"),
            1
        );
    })
    .await;
}

#[tokio::test]
async fn collections_databases_and_unknown_commands() {
    bounded(async {
        let (_emu, client) = setup().await;
        let db = client.database("d");
        db.create_collection("a").await.expect("create");
        let err = db.create_collection("a").await.expect_err("exists");
        assert_eq!(server_code(&err), Some(48));
        db.collection::<Document>("b")
            .insert_one(doc! {"x": 1})
            .await
            .expect("insert");
        let mut names = db.list_collection_names().await.expect("list");
        names.sort();
        assert_eq!(names, vec!["a".to_string(), "b".to_string()]);
        assert!(client
            .list_database_names()
            .await
            .expect("dbs")
            .contains(&"d".to_string()));

        client
            .database("admin")
            .run_command(doc! {"renameCollection": "d.b", "to": "d.c"})
            .await
            .expect("rename");
        let mut names = db.list_collection_names().await.expect("list");
        names.sort();
        assert_eq!(names, vec!["a".to_string(), "c".to_string()]);
        db.collection::<Document>("c").drop().await.expect("drop");
        db.collection::<Document>("never")
            .drop()
            .await
            .expect("drop of a missing collection is ok");
        assert_eq!(
            db.list_collection_names().await.expect("list"),
            vec!["a".to_string()]
        );

        let err = db
            .run_command(doc! {"frobnicate": 1})
            .await
            .expect_err("unknown");
        assert_eq!(server_code(&err), Some(59));
        assert!(
            err.to_string().contains("no such command: 'frobnicate'"),
            "{err}"
        );
        let ping = db.run_command(doc! {"ping": 1}).await.expect("ping");
        assert!(
            ping.get("$clusterTime").is_some() && ping.get("operationTime").is_some(),
            "{ping}"
        );
        db.drop().await.expect("dropDatabase");
        assert!(db.list_collection_names().await.expect("list").is_empty());
    })
    .await;
}

#[tokio::test]
async fn direct_connection_works_too() {
    bounded(async {
        let emu = mongo_emulator::Emulator::start().await.expect("starts");
        let client = client_for(&emu.uri_direct()).await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 1}).await.expect("insert");
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 1);
        assert_eq!(
            emu.documents("d", "c").expect("docs"),
            vec![doc! {"_id": 1}]
        );
    })
    .await;
}

#[tokio::test]
async fn oplog_and_replica_set_status_are_readable() {
    bounded(async {
        let (emu, client) = setup().await;
        client
            .database("d")
            .collection::<Document>("c")
            .insert_one(doc! {"x": 1})
            .await
            .expect("insert");
        let oldest = client
            .database("local")
            .collection::<Document>("oplog.rs")
            .find_one(doc! {})
            .sort(doc! {"$natural": 1})
            .await
            .expect("find oplog")
            .expect("an entry");
        let ts = oldest.get_timestamp("ts").expect("ts");
        assert_eq!(Some(ts), emu.oldest_oplog_time());
        let status = client
            .database("admin")
            .run_command(doc! {"replSetGetStatus": 1})
            .await
            .expect("status");
        assert_eq!(status.get_str("set"), Ok("rs0"));
        let member = status.get_array("members").expect("members")[0]
            .as_document()
            .expect("member")
            .clone();
        assert_eq!(member.get_str("stateStr"), Ok("PRIMARY"));
        assert_eq!(
            member
                .get_document("optime")
                .and_then(|o| o.get_timestamp("ts")),
            Ok(emu.latest_oplog_time())
        );
        assert_eq!(
            status
                .get_document("oldestOplogEntry")
                .and_then(|o| o.get_timestamp("ts")),
            Ok(ts)
        );
    })
    .await;
}

#[tokio::test]
async fn expr_pipeline_updates_and_the_server_clock() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("app").collection::<Document>("locks");
        // The lease idiom: take when free or expired by the server's clock, one conditional
        // upsert with a pipeline update computing the epoch and the expiry.
        let take = |owner: &'static str| {
            let coll = coll.clone();
            async move {
                coll.find_one_and_update(
                    doc! {"_id": "s", "$expr": {"$lte": ["$expiresAt", "$$NOW"]}},
                    vec![doc! {"$set": {
                        "owner": owner,
                        "epoch": {"$add": [{"$ifNull": ["$epoch", 0_i64]}, 1_i64]},
                        "expiresAt": {"$add": ["$$NOW", 30_000]},
                    }}],
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await
            }
        };
        let before = emu.server_time();
        let first = take("a").await.expect("first take").expect("upserted");
        assert_eq!(first.get_i64("epoch").ok(), Some(1));
        let expires = *first.get_datetime("expiresAt").expect("date");
        let ms = expires.timestamp_millis() - before.timestamp_millis();
        assert!(
            (30_000..31_000).contains(&ms),
            "server time + 30 s, got {ms}"
        );

        let held = take("b").await.expect_err("held: the upsert collides");
        assert_eq!(server_code(&held), Some(11000));

        emu.advance_clock(std::time::Duration::from_secs(31));
        let second = take("b").await.expect("second take").expect("updated");
        assert_eq!(second.get_str("owner").ok(), Some("b"));
        assert_eq!(second.get_i64("epoch").ok(), Some(2));

        // Through the `update` command too; an update pipeline may not `$match`.
        let r = coll
            .update_one(
                doc! {"_id": "s"},
                vec![doc! {"$set": {"renewed": true}}, doc! {"$unset": "owner"}],
            )
            .await
            .expect("update pipeline");
        assert_eq!(r.modified_count, 1);
        let now = coll
            .find_one(doc! {"_id": "s"})
            .await
            .expect("find")
            .expect("doc");
        assert!(now.get_bool("renewed").expect("set") && !now.contains_key("owner"));
        let refused = coll
            .update_one(doc! {"_id": "s"}, vec![doc! {"$match": {}}])
            .await
            .expect_err("refused stage");
        assert!(server_code(&refused).is_some());
    })
    .await;
}
