//! The MongoDB adapter through the real `mongodb` driver against the wire-level emulator:
//! every start position, idle tokens, resume, invalidate, lost history, error classification,
//! split events, and the stores.

mod common;

use std::time::Duration;

use bson::{doc, Bson, DateTime, Document};
use common::*;
use flowwarden::port::PutOutcome;
use flowwarden::port::{
    ChangeSource, Checkpoint, CheckpointStore, DeadLetterQuery, DeadLetterStatus, DeadLetterStore,
    LeaseStore, SourceErrorKind, SourceItem, StartAt, StoreErrorKind, StoredPosition,
};
use flowwarden::ResumeToken;
use flowwarden_rs_mongo::{MongoBackend, DLQ_INDEX, SPLIT_STAGE};
use futures::TryStreamExt;
use mongo_emulator::CommandError;
use mongodb::options::ChangeStreamPreAndPostImages;

async fn insert(backend: &MongoBackend, coll: &str, ids: impl IntoIterator<Item = i32>) {
    let c = backend.client().database(DB).collection::<Document>(coll);
    for i in ids {
        c.insert_one(doc! {"_id": i, "n": i}).await.expect("insert");
    }
}

#[tokio::test]
async fn connect_validates_and_reports_unreachable_servers() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        assert_eq!(backend.database(), DB);
        assert!(backend.validate().await.is_ok());
        let problems = MongoBackend::connect(
            "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300&connectTimeoutMS=300",
            "bad.name",
        )
        .await
        .expect_err("refused");
        assert_eq!(problems.len(), 2, "every problem at once: {problems:?}");
        assert!(problems.iter().any(|p| p.contains("bad.name")));
        assert!(problems.iter().any(|p| p.contains("cannot reach")));
        let problems = MongoBackend::connect("not-a-uri", "db")
            .await
            .expect_err("refused");
        assert!(problems[0].contains("connection string"), "{problems:?}");
    })
    .await;
}

#[tokio::test]
async fn open_at_now_has_an_initial_position_and_sees_later_changes_only() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        insert(&backend, "orders", [1]).await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        assert!(
            c.initial_position().is_some(),
            "a stream opened at now can resume without a gap"
        );
        insert(&backend, "orders", [2]).await;
        let ev = next_event(&mut c).await.expect("event");
        assert_eq!(ev.get_str("operationType"), Ok("insert"));
        assert_eq!(key_of(&ev), 2);
        assert!(ev.get_document("fullDocument").is_ok());
    })
    .await;
}

#[tokio::test]
async fn idle_ticks_carry_advancing_post_batch_tokens() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        let first = match next_item(&mut c).await.expect("item") {
            Some(SourceItem::Idle(Some(t))) => t,
            other => panic!("expected an idle tick with a token, got {other:?}"),
        };
        insert(&backend, "elsewhere", 0..5).await;
        let mut last = first.clone();
        for _ in 0..5 {
            match next_item(&mut c).await.expect("item") {
                Some(SourceItem::Idle(Some(t))) => last = t,
                other => panic!("only idle ticks expected, got {other:?}"),
            }
        }
        assert!(last.data() > first.data(), "{last} advanced past {first}");
        // Resuming after an idle token continues without a gap.
        drop(c);
        insert(&backend, "orders", [7]).await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::ResumeAfter(last.clone()))
            .await
            .expect("resume after the idle token");
        let ev = next_event(&mut c).await.expect("event");
        assert_eq!(key_of(&ev), 7);
        // Idle and event tokens compare in stream order by `_data`, as MongoDB documents.
        assert_eq!(
            last.position_cmp(&token_of(&ev)),
            Some(std::cmp::Ordering::Less)
        );
        assert_eq!(first.position_cmp(&last), Some(std::cmp::Ordering::Less));
    })
    .await;
}

#[tokio::test]
async fn resume_after_a_token_and_start_at_an_operation_time() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        insert(&backend, "orders", [1, 2, 3]).await;
        let e1 = next_event(&mut c).await.expect("1");
        let e2 = next_event(&mut c).await.expect("2");
        drop(c);
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::ResumeAfter(token_of(&e1)))
            .await
            .expect("resume");
        assert_eq!(key_of(&next_event(&mut c).await.expect("2")), 2);
        assert_eq!(key_of(&next_event(&mut c).await.expect("3")), 3);
        drop(c);
        let ts = match e2.get("clusterTime") {
            Some(Bson::Timestamp(ts)) => *ts,
            other => panic!("clusterTime: {other:?}"),
        };
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::OperationTime(ts))
            .await
            .expect("startAtOperationTime");
        assert_eq!(
            key_of(&next_event(&mut c).await.expect("2")),
            2,
            "inclusive"
        );
    })
    .await;
}

#[tokio::test]
async fn oldest_available_starts_at_the_oldest_retained_entry() {
    bounded(async {
        let (emu, backend) = emulator().await;
        insert(&backend, "orders", [1, 2, 3, 4]).await;
        emu.keep_last_oplog_entries(2);
        assert!(backend
            .oldest_oplog_time()
            .await
            .expect("readable")
            .is_some());
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::OldestAvailable)
            .await
            .expect("open");
        assert_eq!(key_of(&next_event(&mut c).await.expect("3")), 3);
        assert_eq!(key_of(&next_event(&mut c).await.expect("4")), 4);
    })
    .await;
}

#[tokio::test]
async fn an_invalidate_the_pipeline_filters_out_is_still_handed_over() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        let only_inserts = vec![doc! {"$match": {"operationType": {"$in": ["insert"]}}}];
        let mut c = backend
            .open(&spec("orders", only_inserts.clone()), StartAt::Now)
            .await
            .expect("open");
        insert(&backend, "orders", [1]).await;
        drop_collection(&backend, "orders").await;
        let first = next_event(&mut c).await.expect("the insert");
        assert_eq!(first.get_str("operationType"), Ok("insert"));
        // The server filtered drop and invalidate out and closed the cursor: the backend hands
        // over the invalidate with the post-batch token, so the runtime halts `Invalidated`
        // instead of re-opening in a loop.
        let inv = next_event(&mut c).await.expect("the invalidate");
        assert_eq!(inv.get_str("operationType"), Ok("invalidate"));
        assert_eq!(next_item(&mut c).await.expect("closed"), None);
        drop(c);
        // Its token is the invalidate's: startAfter it reads the recreated collection.
        let token =
            flowwarden::ResumeToken::from_document(inv.get_document("_id").expect("token").clone());
        let mut c = backend
            .open(&spec("orders", only_inserts), StartAt::StartAfter(token))
            .await
            .expect("startAfter the invalidate");
        insert(&backend, "orders", [7]).await;
        assert_eq!(key_of(&next_event(&mut c).await.expect("new insert")), 7);
    })
    .await;
}

#[tokio::test]
async fn invalidate_closes_the_cursor_and_start_after_continues() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        insert(&backend, "orders", [1]).await;
        drop_collection(&backend, "orders").await;
        let ops: Vec<String> = {
            let mut v = Vec::new();
            for _ in 0..3 {
                v.push(next_event(&mut c).await.expect("event"));
            }
            v.iter()
                .map(|e| e.get_str("operationType").unwrap_or("?").to_owned())
                .collect()
        };
        assert_eq!(ops, ["insert", "drop", "invalidate"]);
        assert_eq!(
            next_item(&mut c).await.expect("closed"),
            None,
            "closed after the invalidate"
        );
        drop(c);
        // The invalidate's own token: resumeAfter is refused, startAfter works.
        let mut c2 = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        insert(&backend, "orders", [2]).await;
        let _ = next_event(&mut c2).await.expect("2");
        drop_collection(&backend, "orders").await;
        let _drop = next_event(&mut c2).await.expect("drop");
        let inv = next_event(&mut c2).await.expect("invalidate");
        assert_eq!(inv.get_str("operationType"), Ok("invalidate"));
        let err = backend
            .open(
                &spec("orders", vec![]),
                StartAt::ResumeAfter(token_of(&inv)),
            )
            .await
            .open_err("resumeAfter an invalidate");
        assert_eq!(err.kind, SourceErrorKind::InvalidToken, "{err}");
        assert_eq!(err.code, Some(260));
        let mut c3 = backend
            .open(&spec("orders", vec![]), StartAt::StartAfter(token_of(&inv)))
            .await
            .expect("startAfter an invalidate");
        insert(&backend, "orders", [3]).await;
        assert_eq!(key_of(&next_event(&mut c3).await.expect("3")), 3);
    })
    .await;
}

#[tokio::test]
async fn truncated_history_is_history_lost() {
    bounded(async {
        let (emu, backend) = emulator().await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        insert(&backend, "orders", [1, 2]).await;
        let e1 = next_event(&mut c).await.expect("1");
        let e2 = next_event(&mut c).await.expect("2");
        drop(c);
        emu.truncate_oplog_through(e2.get_document("_id").expect("_id"))
            .expect("truncate");
        let err = backend
            .open(&spec("orders", vec![]), StartAt::ResumeAfter(token_of(&e1)))
            .await
            .open_err("history lost");
        assert_eq!(err.kind, SourceErrorKind::HistoryLost, "{err}");
        assert_eq!(err.code, Some(286));
        let ts = match e1.get("clusterTime") {
            Some(Bson::Timestamp(ts)) => *ts,
            other => panic!("clusterTime: {other:?}"),
        };
        let err = backend
            .open(&spec("orders", vec![]), StartAt::OperationTime(ts))
            .await
            .open_err("history lost");
        assert_eq!(err.kind, SourceErrorKind::HistoryLost, "{err}");
        // An open cursor that falls behind the retained history fails the same way.
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        let _ = next_item(&mut c).await.expect("idle");
        insert(&backend, "orders", [3, 4, 5]).await;
        emu.keep_last_oplog_entries(1);
        let err = next_event(&mut c).await.expect_err("fell behind");
        assert_eq!(err.kind, SourceErrorKind::HistoryLost, "{err}");
    })
    .await;
}

/// Errors injected on `getMore` reach the cursor classified; labelled ones are resumed by the
/// driver itself and never surface.
#[tokio::test]
async fn get_more_errors_are_classified() {
    bounded(async {
        let (emu, backend) = emulator().await;
        let cases: Vec<(CommandError, SourceErrorKind)> = vec![
            (
                CommandError::new(280, "ChangeStreamFatalError", "cannot continue")
                    .with_label("NonResumableChangeStreamError"),
                SourceErrorKind::Fatal,
            ),
            (
                CommandError::not_writable_primary(),
                SourceErrorKind::Resumable,
            ),
            (CommandError::history_lost(), SourceErrorKind::HistoryLost),
            (
                CommandError::new(10334, "BSONObjectTooLarge", "too large"),
                SourceErrorKind::TooLarge,
            ),
            (
                CommandError::new(136, "CappedPositionLost", "capped position lost"),
                SourceErrorKind::HistoryLost,
            ),
            (
                CommandError::new(4321, "Weird", "unknown"),
                SourceErrorKind::Fatal,
            ),
        ];
        for (error, expected) in cases {
            let code = error.code;
            let mut c = backend
                .open(&spec("orders", vec![]), StartAt::Now)
                .await
                .expect("open");
            let _ = next_item(&mut c).await.expect("first (empty) batch");
            emu.fail_get_more(1, error);
            let err = next_event(&mut c).await.expect_err("injected");
            assert_eq!(err.kind, expected, "code {code}: {err}");
            assert_eq!(err.code, Some(code));
            emu.clear_failures();
        }
        // Labelled errors and cursor-not-found are resumed inside the driver: nothing is lost.
        for error in [
            CommandError::shutdown_in_progress(),
            CommandError::cursor_not_found(0),
        ] {
            let mut c = backend
                .open(&spec("orders", vec![]), StartAt::Now)
                .await
                .expect("open");
            let _ = next_item(&mut c).await.expect("first (empty) batch");
            let before = backend.driver_resumes("adapter").expect("monitored");
            emu.fail_get_more(1, error);
            insert(&backend, "orders", [100]).await;
            let ev = next_event(&mut c).await.expect("resumed by the driver");
            assert_eq!(key_of(&ev), 100);
            // The runtime saw no error, but the resume is counted (and logged).
            assert_eq!(
                backend.driver_resumes("adapter"),
                Some(before + 1),
                "one driver resume counted"
            );
            backend
                .client()
                .database(DB)
                .collection::<Document>("orders")
                .delete_many(doc! {})
                .await
                .expect("clean");
            let _ = next_event(&mut c).await.expect("the delete");
        }
    })
    .await;
}

#[tokio::test]
async fn a_retried_driver_resume_of_a_stream_opened_at_now_skips_nothing() {
    // The driver resumes after a resumable getMore error; when that resume's `aggregate` is
    // itself retried (a retryable read), the driver has already used up its cached token and
    // falls back to the stream's original options: for a stream opened at "now", a later now.
    bounded(async {
        let (emu, backend) = emulator().await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        let _ = next_item(&mut c).await.expect("first (empty) batch");
        insert(&backend, "orders", [1]).await;
        assert_eq!(key_of(&next_event(&mut c).await.expect("1")), 1);
        emu.fail_get_more(1, CommandError::cursor_not_found(0));
        emu.fail_aggregate(1, CommandError::shutdown_in_progress());
        insert(&backend, "orders", [2, 3]).await;
        // Resumed from the stream's initial position: 1 again (at-least-once), then 2 and 3.
        let mut keys = Vec::new();
        while keys.last() != Some(&3) {
            keys.push(key_of(
                &next_event(&mut c).await.expect("resumed by the driver"),
            ));
        }
        assert!(keys.ends_with(&[2, 3]), "change 2 is not skipped: {keys:?}");
    })
    .await;
}

#[tokio::test]
async fn open_errors_are_classified() {
    bounded(async {
        let (emu, backend) = emulator().await;
        let err = backend
            .open(
                &spec("orders", vec![doc! {"$lookup": {"from": "x"}}]),
                StartAt::Now,
            )
            .await
            .open_err("unsupported stage");
        assert_eq!(err.kind, SourceErrorKind::Configuration, "{err}");
        let err = backend
            .open(
                &spec("orders", vec![doc! {SPLIT_STAGE: {}}, doc! {"$match": {}}]),
                StartAt::Now,
            )
            .await
            .open_err("split stage not last");
        assert_eq!(err.kind, SourceErrorKind::Configuration, "{err}");
        let err = backend
            .open(
                &spec("orders", vec![doc! {"$project": {"_id": 0}}]),
                StartAt::Now,
            )
            .await;
        if let Err(err) = err {
            assert!(
                matches!(
                    err.kind,
                    SourceErrorKind::Fatal | SourceErrorKind::Configuration
                ),
                "{err}"
            );
        }
        // A non-retryable failure of the opening aggregate surfaces, classified.
        emu.fail_aggregate(
            2,
            CommandError::new(
                13,
                "Unauthorized",
                "not authorized on fwtest to execute command",
            ),
        );
        let err = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .open_err("unauthorized");
        assert_eq!(err.kind, SourceErrorKind::Configuration, "{err}");
        emu.clear_failures();
        // A malformed token: the open fails with a command error the cascade can step past.
        let bad = ResumeToken::from_document(doc! {"_data": "nonsense"});
        let err = backend
            .open(&spec("orders", vec![]), StartAt::ResumeAfter(bad))
            .await
            .open_err("bad token");
        assert_eq!(err.kind, SourceErrorKind::InvalidToken, "{err}");
    })
    .await;
}

/// Step-down seen through a direct connection: 10107 on `getMore` is labelled resumable and
/// resumed by the driver; the open during a step-down fails `Resumable`, never history lost.
#[tokio::test]
async fn step_down_is_resumable_not_history_lost() {
    bounded(async {
        let (emu, _) = emulator().await;
        let uri = format!("{}&retryWrites=false&retryReads=false", emu.uri_direct());
        let backend = MongoBackend::connect(&uri, DB)
            .await
            .expect("connect direct");
        emu.step_down();
        let err = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .open_err("no primary");
        assert_eq!(err.kind, SourceErrorKind::Resumable, "{err}");
        assert_eq!(err.code, Some(10107));
        emu.step_up();
        let c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        assert!(c.initial_position().is_some());
    })
    .await;
}

#[tokio::test]
async fn dropped_connections_are_resumed_without_loss() {
    bounded(async {
        let (emu, backend) = emulator().await;
        let mut c = backend
            .open(&spec("orders", vec![]), StartAt::Now)
            .await
            .expect("open");
        insert(&backend, "orders", [1]).await;
        let e1 = next_event(&mut c).await.expect("1");
        assert_eq!(key_of(&e1), 1);
        emu.close_connections();
        insert(&backend, "orders", [2]).await;
        let mut keys = Vec::new();
        for _ in 0..3 {
            match next_event(&mut c).await {
                Ok(e) => {
                    keys.push(key_of(&e));
                    break;
                }
                Err(e) => {
                    // A network error the driver did not resume itself: the engine re-opens
                    // from its settled position, as here.
                    assert_eq!(e.kind, SourceErrorKind::Resumable, "{e}");
                    c = backend
                        .open(&spec("orders", vec![]), StartAt::ResumeAfter(token_of(&e1)))
                        .await
                        .expect("re-open");
                }
            }
        }
        assert_eq!(keys, [2]);
    })
    .await;
}

#[tokio::test]
async fn split_events_are_reassembled_and_unsplit_ones_are_too_large() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        let db = backend.client().database(DB);
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
        let mut s = spec("big", vec![doc! {SPLIT_STAGE: {}}]);
        s.full_document = flowwarden::FullDocument::WhenAvailable;
        s.full_document_before_change = flowwarden::FullDocumentBeforeChange::WhenAvailable;
        let mut whole_spec = s.clone();
        whole_spec.pipeline.clear();
        let mut split = backend.open(&s, StartAt::Now).await.expect("open split");
        let mut whole = backend.open(&whole_spec, StartAt::Now).await.expect("open");
        coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .await
            .expect("update");
        coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .await
            .expect("update");
        let ev = next_event(&mut split).await.expect("reassembled");
        assert_eq!(ev.get_str("operationType"), Ok("update"));
        assert!(ev.get("splitEvent").is_none());
        assert_eq!(
            ev.get_document("fullDocument")
                .expect("post-image")
                .get_i32("n"),
            Ok(1)
        );
        assert_eq!(
            ev.get_document("fullDocumentBeforeChange")
                .expect("pre-image")
                .get_i32("n"),
            Ok(0)
        );
        // The reassembled event carries the last fragment's token: resuming after it starts at
        // the next event, never in the middle of this one.
        let mut again = backend
            .open(&s, StartAt::ResumeAfter(token_of(&ev)))
            .await
            .expect("resume after the last fragment");
        let next = next_event(&mut again).await.expect("second update");
        assert_eq!(
            next.get_document("fullDocument")
                .expect("post-image")
                .get_i32("n"),
            Ok(2)
        );
        let next2 = next_event(&mut split)
            .await
            .expect("second update, same cursor");
        assert_eq!(next2.get("_id"), next.get("_id"));
        let err = next_event(&mut whole)
            .await
            .expect_err("too large without the split stage");
        assert_eq!(err.kind, SourceErrorKind::TooLarge, "{err}");
        assert_eq!(err.code, Some(10334));
    })
    .await;
}

/// Drops `coll` (the stream on it is invalidated).
async fn drop_collection(backend: &MongoBackend, coll: &str) {
    backend
        .client()
        .database(DB)
        .collection::<Document>(coll)
        .drop()
        .await
        .expect("drop");
}

fn position(data: &str) -> StoredPosition {
    StoredPosition {
        token: ResumeToken::from_document(doc! {"_data": data}),
        cluster_time: Some(bson::Timestamp {
            time: 5,
            increment: 1,
        }),
        wall_time: Some(DateTime::from_millis(1_700_000_000_000)),
        start_after: false,
    }
}

fn checkpoint(stream: &str, data: &str, epoch: Option<i64>) -> Checkpoint {
    Checkpoint {
        stream: stream.into(),
        last_processed: Some(position(data)),
        last_seen: Some(position(data)),
        owner: Some("host-1".into()),
        epoch,
        updated_at: DateTime::from_millis(1_700_000_000_500),
        snapshot: None,
    }
}

#[tokio::test]
async fn checkpoints_round_trip_are_fenced_and_corruption_is_named() {
    bounded(async {
        let (emu, backend) = emulator().await;
        assert_eq!(backend.load("orders").await, Ok(None));
        let cp = checkpoint("orders", "0A", None);
        backend.save(&cp).await.expect("save");
        assert_eq!(backend.load("orders").await, Ok(Some(cp)));
        let mut cp2 = checkpoint("orders", "0B", None);
        cp2.last_processed = None;
        backend.save(&cp2).await.expect("overwrite");
        assert_eq!(
            backend.load("orders").await,
            Ok(Some(cp2)),
            "one document, replaced"
        );
        let n = backend
            .client()
            .database(DB)
            .collection::<Document>("_fw_checkpoints")
            .count_documents(doc! {})
            .await
            .expect("count");
        assert_eq!(n, 1);

        // Epoch fencing: a leader's write carries the epoch of the stream's lease (host-1's
        // second, then third acquisition), and an older epoch is refused.
        let mut lease = None;
        for _ in 0..2 {
            emu.advance_clock(Duration::from_secs(31));
            lease = backend
                .try_acquire("fenced", "host-1", Duration::from_secs(30))
                .await
                .expect("lease store");
        }
        assert_eq!(lease.map(|l| l.epoch), Some(2));
        backend
            .save(&checkpoint("fenced", "01", Some(2)))
            .await
            .expect("epoch 2");
        backend
            .save(&checkpoint("fenced", "02", Some(2)))
            .await
            .expect("same epoch");
        let err = backend
            .save(&checkpoint("fenced", "03", Some(1)))
            .await
            .expect_err("older epoch");
        assert_eq!(err.kind, StoreErrorKind::Fenced, "{err}");
        assert!(err.message.contains("epoch 1"), "{err}");
        emu.advance_clock(Duration::from_secs(31));
        backend
            .try_acquire("fenced", "host-1", Duration::from_secs(30))
            .await
            .expect("lease store")
            .expect("epoch 3");
        backend
            .save(&checkpoint("fenced", "04", Some(3)))
            .await
            .expect("newer epoch");
        let loaded = backend
            .load("fenced")
            .await
            .expect("load")
            .expect("present");
        assert_eq!(loaded.epoch, Some(3));
        assert_eq!(loaded.last_seen.expect("seen").token.data(), Some("04"));

        // Corrupt document: named, not reset.
        backend
            .client()
            .database(DB)
            .collection::<Document>("_fw_checkpoints")
            .insert_one(doc! {"_id": "scarred", "lastSeenToken": 42, "updatedAt": DateTime::now()})
            .await
            .expect("insert corrupt");
        let err = backend.load("scarred").await.expect_err("corrupt");
        assert_eq!(err.kind, StoreErrorKind::Corrupt);
        assert!(
            err.message.contains("scarred") && err.message.contains("lastSeenToken"),
            "{}",
            err.message
        );
    })
    .await;
}

#[tokio::test]
async fn store_outages_are_unavailable() {
    bounded(async {
        let (emu, backend) = emulator().await;
        emu.fail_command(
            "find",
            5,
            CommandError::new(11600, "InterruptedAtShutdown", "shutting down"),
        );
        emu.fail_command(
            "update",
            5,
            CommandError::new(11600, "InterruptedAtShutdown", "shutting down"),
        );
        let err = backend.load("x").await.expect_err("load fails");
        assert_eq!(err.kind, StoreErrorKind::Unavailable, "{err}");
        let err = backend
            .save(&checkpoint("x", "01", None))
            .await
            .expect_err("save fails");
        assert_eq!(err.kind, StoreErrorKind::Unavailable, "{err}");
    })
    .await;
}

#[tokio::test]
async fn dead_letters_are_idempotent_listed_and_updated() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        let a = dead_letter_record("s1", "0A", 3_000);
        let b = dead_letter_record("s1", "0B", 1_000);
        let c = dead_letter_record("s2", "0C", 2_000);
        for r in [&a, &b, &c] {
            assert_eq!(backend.put(r).await, Ok(PutOutcome::Inserted));
        }
        backend
            .set_status(&a.id, DeadLetterStatus::Discarded)
            .await
            .expect("status");
        let mut again = a.clone();
        again.attempts = 2;
        again.last_failed_at = DateTime::from_millis(9_000);
        again.error_chain = vec!["boom again".into()];
        assert_eq!(backend.put(&again).await, Ok(PutOutcome::AlreadyPresent));
        let stored = backend.get(&a.id).await.expect("get").expect("present");
        assert_eq!(stored.attempts, 5);
        assert_eq!(stored.last_failed_at, DateTime::from_millis(9_000));
        assert_eq!(stored.first_failed_at, DateTime::from_millis(3_000));
        assert_eq!(stored.error_chain, ["boom again"]);
        assert_eq!(stored.status, DeadLetterStatus::Pending, "back to pending");

        let all = backend
            .list(&DeadLetterQuery::default())
            .await
            .expect("list");
        let ids: Vec<&str> = all.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            [b.id.as_str(), c.id.as_str(), a.id.as_str()],
            "oldest first"
        );
        let s1 = backend
            .list(&DeadLetterQuery {
                stream: Some("s1".into()),
                status: None,
                limit: Some(1),
            })
            .await
            .expect("list");
        assert_eq!(s1.len(), 1);
        assert_eq!(s1[0].id, b.id);
        backend
            .set_status(&b.id, DeadLetterStatus::Replayed)
            .await
            .expect("status");
        let pending = backend
            .list(&DeadLetterQuery {
                stream: Some("s1".into()),
                status: Some(DeadLetterStatus::Pending),
                limit: None,
            })
            .await
            .expect("list");
        assert_eq!(
            pending.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            [a.id.as_str()]
        );
        assert_eq!(
            backend
                .set_status("nope", DeadLetterStatus::Discarded)
                .await,
            Ok(false)
        );
        assert_eq!(backend.get("nope").await, Ok(None));
        assert!(backend.max_record_bytes() < 16 * 1024 * 1024);
        let mut huge = dead_letter_record("s1", "0D", 1);
        huge.event.insert("blob", "x".repeat(17 * 1024 * 1024));
        let err = backend.put(&huge).await.expect_err("too large");
        assert_eq!(err.kind, StoreErrorKind::TooLarge);
    })
    .await;
}

async fn index_names(backend: &MongoBackend, coll: &str) -> Vec<Document> {
    backend
        .client()
        .database(DB)
        .collection::<Document>(coll)
        .list_indexes()
        .await
        .expect("list indexes")
        .try_collect::<Vec<_>>()
        .await
        .expect("indexes")
        .into_iter()
        .map(|m| {
            let mut d = doc! {"name": m.options.as_ref().and_then(|o| o.name.clone()).unwrap_or_default(), "keys": m.keys};
            if let Some(ttl) = m.options.as_ref().and_then(|o| o.expire_after) {
                d.insert("ttl", ttl.as_secs() as i64);
            }
            d
        })
        .collect()
}

#[tokio::test]
async fn indexes_are_created_idempotently() {
    bounded(async {
        let (_emu, backend) = emulator().await;
        backend.ensure_indexes().await.expect("first");
        backend.ensure_indexes().await.expect("second: idempotent");
        let dlq = index_names(&backend, "_fw_dlq").await;
        assert!(
            dlq.iter().any(|d| d.get_str("name") == Ok(DLQ_INDEX)
                && d.get_document("keys")
                    == Ok(&doc! {"stream": 1, "status": 1, "firstFailedAt": 1})),
            "{dlq:?}"
        );
        // No index at all on `_fw_locks`: a TTL index would delete leases and restart epochs.
        let locks = backend
            .client()
            .database(DB)
            .list_collection_names()
            .await
            .expect("list");
        assert!(!locks.iter().any(|c| c == "_fw_locks"), "{locks:?}");
        // The stores create them on first use too (a fresh backend on the same database).
        let fresh = MongoBackend::from_client(backend.client().clone(), DB);
        let _ = fresh.list(&DeadLetterQuery::default()).await.expect("list");
        let _ = Duration::ZERO;
    })
    .await;
}

#[tokio::test]
async fn a_backend_connected_without_counting_driver_resumes_has_no_monitor() {
    let emu = mongo_emulator::Emulator::start().await.expect("emulator");
    let options = flowwarden_rs_mongo::ConnectOptions {
        count_driver_resumes: true,
    };
    let counted = MongoBackend::connect_with(&emu.uri(), DB, options)
        .await
        .expect("connects");
    assert_eq!(counted.driver_resumes("any"), Some(0));
    // The default: no monitor (it would make the driver parse every reply twice).
    assert_eq!(
        flowwarden_rs_mongo::ConnectOptions::default(),
        flowwarden_rs_mongo::ConnectOptions {
            count_driver_resumes: false
        }
    );
    let uncounted = MongoBackend::connect(&emu.uri(), DB)
        .await
        .expect("connects");
    assert_eq!(uncounted.driver_resumes("any"), None);
    // It streams all the same.
    let mut c = uncounted
        .open(&spec("orders", vec![]), StartAt::Now)
        .await
        .expect("open");
    let _ = next_item(&mut c).await.expect("first (empty) batch");
    insert(&uncounted, "orders", [7]).await;
    let ev = next_event(&mut c).await.expect("the insert");
    assert_eq!(key_of(&ev), 7);
}
