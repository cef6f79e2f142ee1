//! Shared helpers of the adapter tests: an emulator, a backend on it, cursor helpers.
#![allow(dead_code)]

use std::time::Duration;

use bson::DateTime;
use bson::Document;
use flowwarden::port::{
    ChangeCursor, DeadLetterRecord, DeadLetterStatus, SourceError, SourceItem, WatchSpec,
};
use flowwarden::ResumeToken;
use flowwarden_rs_mongo::MongoBackend;
use mongo_emulator::Emulator;

pub const DB: &str = "fwtest";

pub use flowwarden_testkit::init_logs;

/// An emulator and a validated backend on it (database `fwtest`), counting the driver's own
/// resumes (`ConnectOptions::count_driver_resumes`: the adapter's tests check the count).
pub async fn emulator() -> (Emulator, MongoBackend) {
    init_logs();
    let emu = Emulator::start().await.expect("emulator starts");
    let options = flowwarden_rs_mongo::ConnectOptions {
        count_driver_resumes: true,
    };
    let backend = MongoBackend::connect_with(&emu.uri(), DB, options)
        .await
        .expect("backend connects");
    (emu, backend)
}

/// A watch spec for `collection` with a short idle wait.
pub fn spec(collection: &str, pipeline: Vec<Document>) -> WatchSpec {
    WatchSpec {
        stream: "adapter",
        database: Some(DB.to_owned()),
        collection: collection.to_owned(),
        pipeline,
        full_document: flowwarden::FullDocument::Default,
        full_document_before_change: flowwarden::FullDocumentBeforeChange::Off,
        batch_size: 100,
        max_await: Duration::from_millis(100),
    }
}

/// The next item, bounded by 10 s, with an event handed over encoded decoded
/// (`SourceItem::decode`).
pub async fn next_item(
    cursor: &mut Box<dyn ChangeCursor>,
) -> Result<Option<SourceItem>, SourceError> {
    let item = tokio::time::timeout(Duration::from_secs(10), cursor.next())
        .await
        .expect("the cursor answers within 10 s")?;
    Ok(item.map(|i| i.decode().expect("the event is valid BSON")))
}

/// The next event, skipping idle ticks (bounded).
pub async fn next_event(cursor: &mut Box<dyn ChangeCursor>) -> Result<Document, SourceError> {
    for _ in 0..100 {
        match next_item(cursor).await? {
            Some(SourceItem::Event(e)) => return Ok(e),
            Some(SourceItem::Idle(_)) => continue,
            Some(SourceItem::Encoded(_)) => unreachable!("next_item decodes"),
            None => panic!("the cursor closed while an event was expected"),
        }
    }
    panic!("no event after 100 idle ticks")
}

/// The `_id` of an event, as the runtime's token.
pub fn token_of(event: &Document) -> flowwarden::ResumeToken {
    flowwarden::ResumeToken::from_document(event.get_document("_id").expect("_id").clone())
}

/// `documentKey._id` of an event as i32.
pub fn key_of(event: &Document) -> i32 {
    event
        .get_document("documentKey")
        .expect("documentKey")
        .get_i32("_id")
        .expect("int _id")
}

/// Bounds a test body by 60 s.
pub async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test finished within 60 s")
}

/// `expect_err` for an open (a cursor is not `Debug`).
pub trait OpenErr {
    /// The error, or a panic naming `what`.
    fn open_err(self, what: &str) -> SourceError;
}

impl OpenErr for Result<Box<dyn ChangeCursor>, SourceError> {
    fn open_err(self, what: &str) -> SourceError {
        match self {
            Ok(_) => panic!("{what}: the open succeeded"),
            Err(e) => e,
        }
    }
}

/// A pending dead letter of `stream` for the event with token `_data` = `data`, unfenced.
pub fn dead_letter_record(stream: &str, data: &str, first_ms: i64) -> DeadLetterRecord {
    let token = ResumeToken::from_document(bson::doc! {"_data": data});
    DeadLetterRecord {
        id: DeadLetterRecord::id_for(stream, &token),
        stream: stream.into(),
        event: bson::doc! {"_id": {"_data": data}, "operationType": "insert", "documentKey": {"_id": 1}},
        truncated: false,
        token,
        operation_type: "insert".into(),
        document_key: Some(bson::doc! {"_id": 1}),
        error_chain: vec!["boom".into()],
        error_kind: "Failed".into(),
        attempts: 3,
        first_failed_at: DateTime::from_millis(first_ms),
        last_failed_at: DateTime::from_millis(first_ms),
        status: DeadLetterStatus::Pending,
        owner: None,
        epoch: None,
    }
}
