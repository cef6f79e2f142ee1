//! A change source that makes its events up as they are read: a backlog of any length that
//! occupies no memory, so the runtime's own footprint can be measured apart from the source's.

use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Document, Timestamp};
use flowwarden::port::{
    ChangeCursor, ChangeSource, SourceError, SourceErrorKind, SourceItem, StartAt, WatchSpec,
};
use flowwarden::ResumeToken;

use super::{memory_seq, memory_token};

/// A source whose collection holds a backlog of `events` inserts at positions 1..=events
/// (tokens in [`memory_token`]'s format), generated one by one when read, and nothing after.
#[derive(Debug, Clone)]
pub struct GeneratedSource {
    events: u64,
    database: String,
}

impl GeneratedSource {
    /// A backlog of `events` inserts in database `database`.
    pub fn new(events: u64, database: impl Into<String>) -> Self {
        GeneratedSource {
            events,
            database: database.into(),
        }
    }
}

#[async_trait]
impl ChangeSource for GeneratedSource {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        let next = match &at {
            StartAt::ResumeAfter(t) | StartAt::StartAfter(t) => memory_seq(t)
                .map(|s| s + 1)
                .ok_or_else(|| SourceError::new(SourceErrorKind::InvalidToken, "not my token"))?,
            StartAt::OperationTime(ts) => u64::from(ts.increment).max(1),
            StartAt::Now => self.events + 1,
            StartAt::OldestAvailable => 1,
        };
        Ok(Box::new(GeneratedCursor {
            next,
            last: self.events,
            db: spec
                .database
                .clone()
                .unwrap_or_else(|| self.database.clone()),
            coll: spec.collection.clone(),
            max_await: spec.max_await,
            initial: (at == StartAt::Now).then(|| memory_token(self.events)),
        }))
    }

    fn describe(&self) -> String {
        format!("generated backlog of {} inserts", self.events)
    }
}

struct GeneratedCursor {
    next: u64,
    last: u64,
    db: String,
    coll: String,
    max_await: Duration,
    initial: Option<ResumeToken>,
}

#[async_trait]
impl ChangeCursor for GeneratedCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        if self.next > self.last {
            tokio::time::sleep(self.max_await).await;
            return Ok(Some(SourceItem::Idle(Some(memory_token(self.last)))));
        }
        let seq = self.next;
        self.next += 1;
        Ok(Some(SourceItem::Event(event(seq, &self.db, &self.coll))))
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.initial.clone()
    }
}

/// An insert event shaped as the in-memory backend makes them.
fn event(seq: u64, db: &str, coll: &str) -> Document {
    let id = seq as i64;
    doc! {
        "_id": memory_token(seq).as_document().clone(),
        "operationType": "insert",
        "clusterTime": Timestamp { time: 1_700_000_000, increment: seq as u32 },
        "wallTime": bson::DateTime::from_millis(1_700_000_000_000 + id),
        "ns": { "db": db, "coll": coll },
        "documentKey": { "_id": id },
        "fullDocument": { "_id": id, "sku": "A-1", "qty": 1 },
    }
}
