//! Multi-document transactions through the real driver (and, for the server rules a driver
//! never breaks, raw commands on a socket).

mod common;

use std::time::Duration;

use common::{bounded, next_event, server_code, setup};
use futures::TryStreamExt;
use mongo_emulator::{CommandError, Emulator, EmulatorOptions};
use mongodb::bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use mongodb::change_stream::{event::ChangeStreamEvent, ChangeStream};
use mongodb::error::Error;
use mongodb::options::ReturnDocument;
use mongodb::{Client, ClientSession, Collection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn transient(e: &Error) -> bool {
    e.contains_label("TransientTransactionError")
}

/// Opens a stream on `coll` and consumes its (empty) first batch, so that [`drain`] reads
/// from the server.
async fn watch(coll: &Collection<Document>) -> ChangeStream<ChangeStreamEvent<Document>> {
    let mut s = coll.watch().await.expect("watch");
    assert!(s.next_if_any().await.expect("first batch").is_none());
    s
}

/// Everything the stream has now: events up to the first empty `getMore` batch.
async fn drain(
    s: &mut ChangeStream<ChangeStreamEvent<Document>>,
) -> Vec<ChangeStreamEvent<Document>> {
    let mut out = Vec::new();
    while let Some(ev) = s.next_if_any().await.expect("no stream error") {
        out.push(ev);
    }
    out
}

async fn ids(coll: &Collection<Document>) -> Vec<Bson> {
    let docs: Vec<Document> = coll
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("collect");
    docs.into_iter()
        .map(|d| d.get("_id").cloned().unwrap_or(Bson::Null))
        .collect()
}

async fn started(client: &Client) -> ClientSession {
    let mut s = client.start_session().await.expect("session");
    s.start_transaction().await.expect("start transaction");
    s
}

#[tokio::test]
async fn commit_makes_every_write_visible_at_once() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_many([doc! {"_id": 0, "n": 0}, doc! {"_id": 9, "n": 9}])
            .await
            .expect("seed");
        let mut stream = watch(&coll).await;
        let mut s = started(&client).await;
        for i in 1..4 {
            coll.insert_one(doc! {"_id": i, "n": i})
                .session(&mut s)
                .await
                .expect("insert in txn");
        }
        coll.update_one(doc! {"_id": 0}, doc! {"$set": {"n": 100}})
            .session(&mut s)
            .await
            .expect("update in txn");
        coll.delete_one(doc! {"_id": 9})
            .session(&mut s)
            .await
            .expect("delete in txn");
        assert_eq!(emu.open_transactions(), 1);

        // Nobody else sees any of it: other reads, the stream, the test helper.
        assert_eq!(ids(&coll).await, vec![Bson::Int32(0), Bson::Int32(9)]);
        let zero = coll
            .find_one(doc! {"_id": 0})
            .await
            .expect("find")
            .expect("doc");
        assert_eq!(
            zero.get_i32("n"),
            Ok(0),
            "the update is not visible outside"
        );
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 2);
        assert_eq!(emu.documents("d", "c").expect("docs").len(), 2);
        assert!(
            drain(&mut stream).await.is_empty(),
            "no event before the commit"
        );

        s.commit_transaction().await.expect("commit");
        assert_eq!(emu.open_transactions(), 0);
        assert_eq!(emu.transactions_committed(), 1);
        assert_eq!(
            ids(&coll).await,
            (0..4).map(Bson::Int32).collect::<Vec<_>>(),
            "inserts and the delete applied"
        );
        let zero = coll
            .find_one(doc! {"_id": 0})
            .await
            .expect("find")
            .expect("doc");
        assert_eq!(zero.get_i32("n"), Ok(100));
        let events = drain(&mut stream).await;
        assert_eq!(
            events.len(),
            5,
            "every write of the transaction, once: {events:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn events_of_a_transaction_are_consecutive_and_carry_its_session() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let other = client.database("d").collection::<Document>("other");
        let mut stream = client.database("d").watch().await.expect("watch");
        let mut s = started(&client).await;
        let lsid = s.id().clone();
        coll.insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .expect("insert");
        // A plain write while the transaction is open is logged before the commit.
        other
            .insert_one(doc! {"_id": "plain"})
            .await
            .expect("plain insert");
        other
            .insert_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .expect("insert");
        coll.update_one(doc! {"_id": 1}, doc! {"$set": {"x": 1}})
            .session(&mut s)
            .await
            .expect("update");
        s.commit_transaction().await.expect("commit");
        coll.insert_one(doc! {"_id": "after"})
            .await
            .expect("plain insert");

        let plain = next_event(&mut stream).await;
        assert_eq!(plain.document_key, Some(doc! {"_id": "plain"}));
        assert_eq!(plain.lsid, None);
        assert_eq!(plain.txn_number, None);
        let txn: Vec<_> = [
            next_event(&mut stream).await,
            next_event(&mut stream).await,
            next_event(&mut stream).await,
        ]
        .into();
        let keys: Vec<_> = txn.iter().map(|e| e.document_key.clone()).collect();
        assert_eq!(
            keys,
            vec![
                Some(doc! {"_id": 1}),
                Some(doc! {"_id": 2}),
                Some(doc! {"_id": 1})
            ]
        );
        for e in &txn {
            let ev_lsid = e.lsid.as_ref().expect("lsid on a transaction's event");
            assert_eq!(ev_lsid.get("id"), lsid.get("id"), "the session's UUID");
            assert!(
                matches!(ev_lsid.get("uid"), Some(Bson::Binary(b)) if b.bytes.len() == 32),
                "{ev_lsid}"
            );
            assert_eq!(e.txn_number, Some(1));
            assert_eq!(e.cluster_time, txn[0].cluster_time, "one commit time");
        }
        assert_ne!(txn[0].id, txn[1].id);
        assert_ne!(txn[1].id, txn[2].id);
        let after = next_event(&mut stream).await;
        assert_eq!(after.document_key, Some(doc! {"_id": "after"}));
        assert_eq!(after.lsid, None);
    })
    .await;
}

#[tokio::test]
async fn own_writes_are_visible_inside_the_transaction() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 0, "n": 0})
            .await
            .expect("seed");
        let mut s = started(&client).await;
        coll.insert_many((1..6).map(|i| doc! {"_id": i, "n": i}))
            .session(&mut s)
            .await
            .expect("insert");
        // find with getMore (batches of 2), inside the transaction.
        let mut cursor = coll
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .batch_size(2)
            .session(&mut s)
            .await
            .expect("find");
        let seen: Vec<Document> = cursor.stream(&mut s).try_collect().await.expect("collect");
        assert_eq!(seen.len(), 6);
        assert_eq!(
            coll.count_documents(doc! {"n": {"$gte": 3}})
                .session(&mut s)
                .await
                .expect("countDocuments"),
            3
        );
        let updated = coll
            .find_one_and_update(doc! {"_id": 5}, doc! {"$inc": {"n": 10}})
            .return_document(ReturnDocument::After)
            .session(&mut s)
            .await
            .expect("findAndModify")
            .expect("found");
        assert_eq!(updated.get_i32("n"), Ok(15));
        let up = coll
            .update_one(doc! {"_id": 7}, doc! {"$set": {"n": 7}})
            .upsert(true)
            .session(&mut s)
            .await
            .expect("upsert");
        assert_eq!(up.upserted_id, Some(Bson::Int32(7)));
        let seven = coll
            .find_one(doc! {"_id": 7})
            .session(&mut s)
            .await
            .expect("find")
            .expect("the upserted document");
        assert_eq!(seven.get_i32("n"), Ok(7));
        let agg: Vec<Document> = coll
            .aggregate([doc! {"$match": {"n": {"$gt": 4}}}, doc! {"$count": "k"}])
            .session(&mut s)
            .await
            .expect("aggregate")
            .stream(&mut s)
            .try_collect()
            .await
            .expect("collect");
        assert_eq!(agg, vec![doc! {"k": 2}]);
        // Outside, still only the seed.
        assert_eq!(ids(&coll).await, vec![Bson::Int32(0)]);
        s.commit_transaction().await.expect("commit");
        assert_eq!(emu.open_transactions(), 0);
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 7);
    })
    .await;
}

#[tokio::test]
async fn abort_and_a_dropped_session_discard_everything() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut stream = watch(&coll).await;
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .expect("insert");
        s.abort_transaction().await.expect("abort");
        assert_eq!(emu.transactions_aborted(), 1);
        assert_eq!(emu.open_transactions(), 0);

        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .expect("insert");
        assert_eq!(emu.open_transactions(), 1);
        drop(s); // the driver sends abortTransaction from a spawned task
        for _ in 0..200 {
            if emu.open_transactions() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            emu.open_transactions(),
            0,
            "the dropped session's transaction is aborted"
        );
        assert_eq!(emu.transactions_aborted(), 2);
        assert_eq!(emu.transactions_committed(), 0);
        assert!(ids(&coll).await.is_empty());
        assert!(drain(&mut stream).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_plain_write_before_the_transaction_writes_conflicts_at_the_write() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 1, "n": 0})
            .await
            .expect("seed");
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .expect("insert");
        coll.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 1}})
            .await
            .expect("plain update");
        let err = coll
            .update_one(doc! {"_id": 1}, doc! {"$set": {"n": 2}})
            .session(&mut s)
            .await
            .expect_err("write conflict");
        assert_eq!(server_code(&err), Some(112), "{err}");
        assert!(transient(&err), "{err}");
        assert_eq!(
            emu.open_transactions(),
            0,
            "the conflict aborted the transaction"
        );
        let err = s.commit_transaction().await.expect_err("nothing to commit");
        assert_eq!(server_code(&err), Some(251), "{err}");
        assert!(transient(&err));
        assert_eq!(ids(&coll).await, vec![Bson::Int32(1)], "nothing applied");
        let one = coll
            .find_one(doc! {"_id": 1})
            .await
            .expect("find")
            .expect("doc");
        assert_eq!(one.get_i32("n"), Ok(1), "the plain write stands");
    })
    .await;
}

#[tokio::test]
async fn a_write_after_the_transactions_write_makes_its_commit_conflict() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_many([doc! {"_id": 1, "n": 0}, doc! {"_id": 2, "n": 0}])
            .await
            .expect("seed");
        // A transaction against a plain write: the first committed write wins.
        let mut s = started(&client).await;
        coll.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 10}})
            .session(&mut s)
            .await
            .expect("txn update");
        coll.insert_one(doc! {"_id": 3})
            .session(&mut s)
            .await
            .expect("txn insert");
        coll.update_one(doc! {"_id": 1}, doc! {"$set": {"n": 1}})
            .await
            .expect("plain update (no locks in the emulator)");
        let err = s
            .commit_transaction()
            .await
            .expect_err("conflict at commit");
        assert_eq!(server_code(&err), Some(112), "{err}");
        assert!(transient(&err));
        assert_eq!(ids(&coll).await, vec![Bson::Int32(1), Bson::Int32(2)]);
        let one = coll
            .find_one(doc! {"_id": 1})
            .await
            .expect("find")
            .expect("doc");
        assert_eq!(one.get_i32("n"), Ok(1));

        // Two transactions on one document: the first committer wins.
        let mut a = started(&client).await;
        let mut b = started(&client).await;
        coll.update_one(doc! {"_id": 2}, doc! {"$set": {"n": 20}})
            .session(&mut a)
            .await
            .expect("a");
        coll.update_one(doc! {"_id": 2}, doc! {"$set": {"n": 30}})
            .session(&mut b)
            .await
            .expect("b");
        a.commit_transaction().await.expect("a commits first");
        let err = b.commit_transaction().await.expect_err("b conflicts");
        assert_eq!(server_code(&err), Some(112));
        let two = coll
            .find_one(doc! {"_id": 2})
            .await
            .expect("find")
            .expect("doc");
        assert_eq!(two.get_i32("n"), Ok(20));
        assert_eq!(emu.transactions_committed(), 1);
        assert_eq!(emu.transactions_aborted(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_commit_whose_reply_is_lost_is_retried_and_applies_once() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut stream = watch(&coll).await;

        // One lost reply with a retryable error: the driver retries the commit by itself.
        let mut s = started(&client).await;
        coll.insert_many((0..3).map(|i| doc! {"_id": i}))
            .session(&mut s)
            .await
            .expect("insert");
        emu.fail_commit_after_applying(1, CommandError::interrupted_due_to_repl_state_change());
        emu.reset_command_counts();
        s.commit_transaction()
            .await
            .expect("the driver's own retry succeeds");
        assert_eq!(emu.command_count("commitTransaction"), 2);
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 3);

        // Two: the caller sees UnknownTransactionCommitResult, although it committed; a
        // retry by the caller succeeds and applies nothing twice.
        let mut s = started(&client).await;
        coll.insert_many((3..6).map(|i| doc! {"_id": i}))
            .session(&mut s)
            .await
            .expect("insert");
        emu.fail_commit_after_applying(2, CommandError::interrupted_due_to_repl_state_change());
        emu.reset_command_counts();
        let err = s.commit_transaction().await.expect_err("both replies lost");
        assert!(
            err.contains_label("UnknownTransactionCommitResult"),
            "{err}"
        );
        assert!(!transient(&err));
        assert_eq!(server_code(&err), Some(11602));
        assert_eq!(emu.command_count("commitTransaction"), 2);
        assert_eq!(
            emu.documents("d", "c").expect("docs").len(),
            6,
            "already applied"
        );
        s.commit_transaction()
            .await
            .expect("the caller's retry succeeds");
        assert_eq!(emu.command_count("commitTransaction"), 3);

        // A non-retryable error (MaxTimeMSExpired) is labelled but not retried.
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 6})
            .session(&mut s)
            .await
            .expect("insert");
        emu.fail_commit_after_applying(1, CommandError::max_time_ms_expired());
        emu.reset_command_counts();
        let err = s.commit_transaction().await.expect_err("reply lost");
        assert!(
            err.contains_label("UnknownTransactionCommitResult"),
            "{err}"
        );
        assert_eq!(emu.command_count("commitTransaction"), 1);
        s.commit_transaction().await.expect("retry");

        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 7);
        assert_eq!(emu.transactions_committed(), 3);
        let events = drain(&mut stream).await;
        assert_eq!(events.len(), 7, "each write streamed exactly once");
    })
    .await;
}

#[tokio::test]
async fn injected_errors_inside_a_transaction() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        // Labelled TransientTransactionError: the transaction is aborted.
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .expect("insert");
        emu.fail_command("insert", 1, CommandError::write_conflict());
        let err = coll
            .insert_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .expect_err("injected");
        assert!(transient(&err));
        assert_eq!(emu.open_transactions(), 0);
        let err = s.commit_transaction().await.expect_err("aborted");
        assert_eq!(server_code(&err), Some(251));

        // An unlabelled error on the commit: not applied, the transaction stays open.
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 3})
            .session(&mut s)
            .await
            .expect("insert");
        emu.fail_command("commitTransaction", 1, CommandError::bad_value("injected"));
        let err = s.commit_transaction().await.expect_err("injected");
        assert_eq!(server_code(&err), Some(2));
        assert!(ids(&coll).await.is_empty());
        assert_eq!(emu.open_transactions(), 1);
        s.commit_transaction().await.expect("second commit");
        assert_eq!(ids(&coll).await, vec![Bson::Int32(3)]);
    })
    .await;
}

#[tokio::test]
async fn a_transaction_expires_after_its_lifetime_in_server_time() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .expect("insert");
        emu.advance_clock(Duration::from_secs(59));
        coll.insert_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .expect("still open");
        emu.advance_clock(Duration::from_secs(2));
        assert_eq!(emu.open_transactions(), 0);
        assert_eq!(emu.transactions_aborted(), 1);
        let err = coll
            .insert_one(doc! {"_id": 3})
            .session(&mut s)
            .await
            .expect_err("expired");
        assert_eq!(server_code(&err), Some(251), "{err}");
        assert!(transient(&err));
        let err = s.commit_transaction().await.expect_err("expired");
        assert_eq!(server_code(&err), Some(251));
        assert!(ids(&coll).await.is_empty());

        // The limit is an option.
        let emu = Emulator::start_with(EmulatorOptions {
            transaction_lifetime_limit: Duration::from_secs(5),
            ..EmulatorOptions::default()
        })
        .await
        .expect("start");
        let client = common::client_for(&emu.uri()).await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .expect("insert");
        emu.advance_clock(Duration::from_secs(4));
        assert_eq!(emu.open_transactions(), 1);
        emu.advance_clock(Duration::from_secs(2));
        let err = s.commit_transaction().await.expect_err("expired");
        assert_eq!(server_code(&err), Some(251));
    })
    .await;
}

#[tokio::test]
async fn what_a_transaction_refuses_and_its_size_limit() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = started(&client).await;
        coll.insert_one(doc! {"_id": 0})
            .session(&mut s)
            .await
            .expect("insert");
        let Err(err) = coll.watch().session(&mut s).await else {
            panic!("a change stream opened inside a transaction");
        };
        assert_eq!(server_code(&err), Some(263), "{err}");
        assert_eq!(
            emu.open_transactions(),
            0,
            "a failed command aborts the transaction"
        );

        let mut s = started(&client).await;
        let err = client
            .database("d")
            .run_command(doc! {"count": "c"})
            .session(&mut s)
            .await
            .expect_err("count is refused in a txn");
        assert_eq!(server_code(&err), Some(263), "{err}");

        // Over 16 MiB of writes: the commit fails with 257 TransactionTooLarge.
        let big = "x".repeat(4 * 1024 * 1024);
        let mut s = started(&client).await;
        for i in 0..5 {
            coll.insert_one(doc! {"_id": i, "s": big.clone()})
                .session(&mut s)
                .await
                .expect("insert a 4 MiB document");
        }
        let err = s.commit_transaction().await.expect_err("too large");
        assert_eq!(server_code(&err), Some(257), "{err}");
        assert!(ids(&coll).await.is_empty());
    })
    .await;
}

// ----- raw commands: the rules a driver never breaks ----------------------------------------

struct Raw {
    s: TcpStream,
    next: i32,
    lsid: Document,
}

impl Raw {
    async fn connect(emu: &Emulator) -> Raw {
        Raw {
            s: TcpStream::connect(emu.addr()).await.expect("connect"),
            next: 1,
            lsid: doc! {"id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] }},
        }
    }

    async fn run(&mut self, mut body: Document, db: &str) -> Document {
        body.insert("lsid", self.lsid.clone());
        body.insert("$db", db);
        let bytes = mongodb::bson::to_vec(&body).expect("bson");
        let mut m = Vec::new();
        let len = i32::try_from(16 + 4 + 1 + bytes.len()).expect("small");
        for v in [len, self.next, 0, 2013, 0] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.push(0);
        m.extend_from_slice(&bytes);
        self.next += 1;
        self.s.write_all(&m).await.expect("write");
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).await.expect("header");
        let len = usize::try_from(i32::from_le_bytes(len)).expect("positive");
        let mut rest = vec![0u8; len - 4];
        self.s.read_exact(&mut rest).await.expect("body");
        Document::from_reader(&rest[12 + 4 + 1..]).expect("bson reply")
    }

    async fn insert(&mut self, txn: i64, start: bool, id: i32) -> Document {
        let mut body = doc! {
            "insert": "c", "documents": [{"_id": id}], "txnNumber": txn, "autocommit": false,
        };
        if start {
            body.insert("startTransaction", true);
        }
        self.run(body, "d").await
    }

    async fn end(&mut self, command: &str, txn: i64) -> Document {
        self.run(
            doc! {command: 1, "txnNumber": txn, "autocommit": false},
            "admin",
        )
        .await
    }
}

fn code(reply: &Document) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn labels(reply: &Document) -> Vec<String> {
    reply
        .get_array("errorLabels")
        .map(|a| {
            a.iter()
                .filter_map(|l| l.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn session_rules_no_such_transaction_too_old_committed() {
    bounded(async {
        let (emu, client) = setup().await;
        let mut raw = Raw::connect(&emu).await;
        // No transaction 1 was ever started.
        let r = raw.insert(1, false, 0).await;
        assert_eq!(code(&r), Some(251), "{r}");
        assert_eq!(labels(&r), vec!["TransientTransactionError"]);
        assert_eq!(code(&raw.end("commitTransaction", 1).await), Some(251));

        assert_eq!(raw.insert(2, true, 1).await.get_f64("ok"), Ok(1.0));
        let r = raw.insert(1, false, 2).await;
        assert_eq!(code(&r), Some(225), "an older txnNumber: {r}");
        assert_eq!(code(&raw.insert(1, true, 2).await), Some(225));
        assert_eq!(
            code(&raw.insert(2, true, 2).await),
            Some(117),
            "started twice"
        );
        // A newer transaction aborts the open one.
        assert_eq!(raw.insert(3, true, 3).await.get_f64("ok"), Ok(1.0));
        assert_eq!(emu.open_transactions(), 1);
        assert_eq!(emu.transactions_aborted(), 1);
        assert_eq!(code(&raw.end("commitTransaction", 2).await), Some(225));
        // A number never started on this session.
        assert_eq!(code(&raw.insert(4, false, 4).await), Some(251));

        let ok = raw.end("commitTransaction", 3).await;
        assert_eq!(ok.get_f64("ok"), Ok(1.0), "{ok}");
        assert!(ok.get_timestamp("operationTime").is_ok());
        let again = raw.end("commitTransaction", 3).await;
        assert_eq!(
            again.get_f64("ok"),
            Ok(1.0),
            "a retried commit succeeds: {again}"
        );
        assert_eq!(code(&raw.end("abortTransaction", 3).await), Some(256));
        assert_eq!(code(&raw.insert(3, false, 5).await), Some(256));
        assert_eq!(emu.transactions_committed(), 1);
        let coll = client.database("d").collection::<Document>("c");
        assert_eq!(
            ids(&coll).await,
            vec![Bson::Int32(3)],
            "only transaction 3's write"
        );

        // commitTransaction / abortTransaction: admin only, and only within a transaction.
        assert_eq!(raw.insert(5, true, 6).await.get_f64("ok"), Ok(1.0));
        let r = raw
            .run(
                doc! {"commitTransaction": 1, "txnNumber": 5i64, "autocommit": false},
                "d",
            )
            .await;
        assert_eq!(code(&r), Some(13), "{r}");
        let r = raw.run(doc! {"commitTransaction": 1}, "admin").await;
        assert_eq!(code(&r), Some(72), "{r}");
        assert_eq!(raw.end("abortTransaction", 5).await.get_f64("ok"), Ok(1.0));
        let r = raw.end("abortTransaction", 5).await;
        assert_eq!(code(&r), Some(251), "{r}");
        let r = raw.end("commitTransaction", 5).await;
        assert_eq!(code(&r), Some(251), "{r}");
        // A retryable write with an older number is too old as well.
        let r = raw
            .run(
                doc! {"insert": "c", "documents": [{"_id": 9}], "txnNumber": 4i64},
                "d",
            )
            .await;
        assert_eq!(code(&r), Some(225), "{r}");
        assert_eq!(emu.open_transactions(), 0);
    })
    .await;
}
