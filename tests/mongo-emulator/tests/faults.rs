//! Fault injection, observed through the real driver.

mod common;

use std::time::{Duration, Instant};

use common::{bounded, client_for, next_event, server_code, setup};
use futures::StreamExt;
use mongo_emulator::{CommandError, Emulator};
use mongodb::bson::{doc, Document};
use mongodb::options::ClientOptions;
use mongodb::Client;

#[tokio::test]
async fn driver_resumes_once_after_a_resumable_get_more_error() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll.watch().await.expect("watch");
        coll.insert_many((0..3).map(|i| doc! {"_id": i}))
            .await
            .expect("insert");
        for i in 0..3 {
            assert_eq!(next_event(&mut s).await.document_key, Some(doc! {"_id": i}));
        }
        assert_eq!(emu.command_count("aggregate"), 1);
        emu.fail_get_more(1, CommandError::shutdown_in_progress());
        coll.insert_many((3..6).map(|i| doc! {"_id": i}))
            .await
            .expect("insert");
        for i in 3..6 {
            assert_eq!(
                next_event(&mut s).await.document_key,
                Some(doc! {"_id": i}),
                "each event exactly once"
            );
        }
        assert_eq!(
            emu.command_count("aggregate"),
            2,
            "the driver re-opened the stream once"
        );
    })
    .await;
}

#[tokio::test]
async fn cursor_not_found_is_resumed_by_its_code() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll.watch().await.expect("watch");
        coll.insert_one(doc! {"_id": 0}).await.expect("insert");
        next_event(&mut s).await;
        emu.fail_get_more(1, CommandError::cursor_not_found(1));
        coll.insert_one(doc! {"_id": 1}).await.expect("insert");
        assert_eq!(next_event(&mut s).await.document_key, Some(doc! {"_id": 1}));
        assert_eq!(emu.command_count("aggregate"), 2);
    })
    .await;
}

#[tokio::test]
async fn unlabelled_errors_reach_the_caller() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll.watch().await.expect("watch");
        emu.fail_get_more(
            1,
            CommandError::new(280, "ChangeStreamFatalError", "injected")
                .with_label("NonResumableChangeStreamError"),
        );
        coll.insert_one(doc! {"_id": 0}).await.expect("insert");
        let err = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("in time")
            .expect("an item")
            .expect_err("not resumed");
        assert_eq!(server_code(&err), Some(280));
        assert_eq!(emu.command_count("aggregate"), 1);

        // An opening aggregate is a retryable read: one step-down error is retried away...
        emu.reset_command_counts();
        emu.fail_aggregate(1, CommandError::primary_stepped_down());
        coll.watch().await.expect("retried by the driver");
        assert_eq!(emu.command_count("aggregate"), 2);
        // ...two are returned to the caller, and a non-retryable one at once.
        emu.fail_aggregate(2, CommandError::primary_stepped_down());
        let err = coll
            .watch()
            .await
            .expect_err("opening aggregate error is returned");
        assert_eq!(server_code(&err), Some(189));
        emu.fail_aggregate(1, CommandError::new(13, "Unauthorized", "injected"));
        let err = coll
            .watch()
            .await
            .expect_err("opening aggregate error is returned");
        assert_eq!(server_code(&err), Some(13));
    })
    .await;
}

#[tokio::test]
async fn any_named_command_can_fail_n_times() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        emu.fail_command("find", 2, CommandError::new(2, "BadValue", "injected"));
        for _ in 0..2 {
            let err = coll.find_one(doc! {}).await.expect_err("injected");
            assert_eq!(server_code(&err), Some(2));
        }
        assert!(coll
            .find_one(doc! {})
            .await
            .expect("third find works")
            .is_none());
        assert_eq!(emu.command_count("find"), 3);
    })
    .await;
}

async fn direct_client_without_retries(emu: &Emulator) -> Client {
    let mut options = ClientOptions::parse(format!(
        "{}&retryWrites=false&retryReads=false",
        emu.uri_direct()
    ))
    .await
    .expect("parse");
    options.server_selection_timeout = Some(Duration::from_secs(5));
    Client::with_options(options).expect("client")
}

#[tokio::test]
async fn step_down_rejects_writes_with_10107_until_step_up() {
    bounded(async {
        let emu = Emulator::start().await.expect("start");
        let client = direct_client_without_retries(&emu).await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 1})
            .await
            .expect("insert while primary");
        emu.step_down();
        let err = coll
            .insert_one(doc! {"_id": 2})
            .await
            .expect_err("not primary");
        assert_eq!(server_code(&err), Some(10107), "{err}");
        let hello = client
            .database("admin")
            .run_command(doc! {"hello": 1})
            .await
            .expect("hello");
        assert_eq!(hello.get_bool("isWritablePrimary"), Ok(false));
        assert_eq!(hello.get_bool("secondary"), Ok(true));
        emu.step_up();
        // The driver may need a heartbeat to see the primary again; retry within a bound.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match coll.insert_one(doc! {"_id": 2}).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    assert_eq!(
                        server_code(&e),
                        None,
                        "only selection errors expected after step-up: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("insert after step-up failed: {e}"),
            }
        }
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 2);
    })
    .await;
}

#[tokio::test]
async fn closing_connections_makes_the_driver_reconnect() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 1}).await.expect("insert");
        let before = emu.connections_accepted();
        emu.close_connections();
        // A retryable read survives one network error.
        let deadline = Instant::now() + Duration::from_secs(10);
        let found = loop {
            match coll.find_one(doc! {"_id": 1}).await {
                Ok(d) => break d,
                Err(e) if Instant::now() < deadline => {
                    tracing_free_sleep(&e).await;
                }
                Err(e) => panic!("driver did not reconnect: {e}"),
            }
        };
        assert_eq!(found, Some(doc! {"_id": 1}));
        assert!(
            emu.connections_accepted() > before,
            "new connections were opened"
        );
    })
    .await;
}

async fn tracing_free_sleep(_e: &mongodb::error::Error) {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn change_stream_survives_closed_connections() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll.watch().await.expect("watch");
        coll.insert_one(doc! {"_id": 0}).await.expect("insert");
        next_event(&mut s).await;
        emu.close_connections();
        let writer = client_for(&emu.uri()).await;
        writer
            .database("d")
            .collection::<Document>("c")
            .insert_one(doc! {"_id": 1})
            .await
            .expect("insert");
        assert_eq!(next_event(&mut s).await.document_key, Some(doc! {"_id": 1}));
        assert!(
            emu.command_count("aggregate") >= 2,
            "the stream was re-opened after the network error"
        );
    })
    .await;
}

#[tokio::test]
async fn replies_can_be_delayed() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        coll.insert_one(doc! {"_id": 1}).await.expect("insert");
        emu.delay_command("find", Some(Duration::from_millis(200)));
        let t = Instant::now();
        coll.find_one(doc! {}).await.expect("find");
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        emu.delay_command("find", None);
        let t = Instant::now();
        coll.find_one(doc! {}).await.expect("find");
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
    })
    .await;
}

#[tokio::test]
async fn idle_get_more_waits_for_max_await_time() {
    bounded(async {
        let (_emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll
            .watch()
            .max_await_time(Duration::from_millis(300))
            .await
            .expect("watch");
        // The first call consumes the (empty) first batch of the aggregate; the second is a getMore.
        assert!(s.next_if_any().await.expect("ok").is_none());
        let t = Instant::now();
        assert!(s.next_if_any().await.expect("ok").is_none());
        assert!(
            t.elapsed() >= Duration::from_millis(280),
            "{:?}",
            t.elapsed()
        );
        // A write wakes a waiting getMore early.
        let writer = coll.clone();
        let wake = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            writer.insert_one(doc! {"_id": 1}).await.expect("insert");
        });
        let mut s = coll
            .watch()
            .max_await_time(Duration::from_secs(5))
            .await
            .expect("watch");
        let t = Instant::now();
        let ev = next_event(&mut s).await;
        assert_eq!(ev.document_key, Some(doc! {"_id": 1}));
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        wake.await.expect("writer");
    })
    .await;
}

#[tokio::test]
async fn keep_last_entries_truncates_open_streams_history() {
    bounded(async {
        let (emu, client) = setup().await;
        let coll = client.database("d").collection::<Document>("c");
        let mut s = coll
            .watch()
            .max_await_time(Duration::from_millis(50))
            .await
            .expect("watch");
        coll.insert_many((0..10).map(|i| doc! {"_id": i}))
            .await
            .expect("insert");
        emu.keep_last_oplog_entries(3);
        assert_eq!(emu.oplog_len(), 3);
        let err = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("in time")
            .expect("an item")
            .expect_err("history lost under an open stream");
        assert_eq!(server_code(&err), Some(286), "{err}");
        assert!(err.contains_label("NonResumableChangeStreamError"));
    })
    .await;
}

#[tokio::test]
async fn binary_prints_its_uri_and_serves() {
    bounded(async {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mongo-emulator"))
            .arg("--port")
            .arg("0")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("binary starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::io::BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("reads a line");
        let uri = line.trim().to_string();
        assert!(
            uri.starts_with("mongodb://127.0.0.1:") && uri.ends_with("replicaSet=rs0"),
            "{uri}"
        );
        let client = client_for(&uri).await;
        client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .expect("ping");
        child.kill().await.expect("kill");
    })
    .await;
}
