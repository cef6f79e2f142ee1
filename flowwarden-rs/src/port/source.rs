//! The change source: where events come from (MongoDB, the in-memory backend, a simulation).
//!
//! The engine opens a cursor at a position it chooses (never the driver), reads events and
//! idle ticks from it in one task, and classifies every error by [`SourceErrorKind`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bson::{DateTime, Document, Timestamp};

use super::scan::ScanRequest;
use crate::definition::{FullDocument, FullDocumentBeforeChange};
use crate::event::ResumeToken;

/// What to watch and how: everything a source needs to open a cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchSpec {
    /// The stream's name (for logs and errors).
    pub stream: &'static str,
    /// Database; `None` means the backend's default database.
    pub database: Option<String>,
    /// Collection.
    pub collection: String,
    /// Server-side stages after `$changeStream`.
    pub pipeline: Vec<Document>,
    /// `fullDocument` option.
    pub full_document: FullDocument,
    /// `fullDocumentBeforeChange` option.
    pub full_document_before_change: FullDocumentBeforeChange,
    /// Events per batch the source should ask for.
    pub batch_size: u32,
    /// How long one read may wait on an idle stream before it reports an idle tick.
    pub max_await: Duration,
}

/// Where to open a cursor.
#[derive(Debug, Clone, PartialEq)]
pub enum StartAt {
    /// Just after the event (or post-batch position) with this token.
    ResumeAfter(ResumeToken),
    /// Just after this token, which may be an invalidate's (`startAfter`).
    StartAfter(ResumeToken),
    /// At this operation time (`startAtOperationTime`).
    OperationTime(Timestamp),
    /// At the current head: only later changes.
    Now,
    /// At the oldest retained history entry.
    OldestAvailable,
}

impl fmt::Display for StartAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartAt::ResumeAfter(t) => write!(f, "resumeAfter {t}"),
            StartAt::StartAfter(t) => write!(f, "startAfter {t}"),
            StartAt::OperationTime(ts) => {
                write!(f, "startAtOperationTime {}.{}", ts.time, ts.increment)
            }
            StartAt::Now => f.write_str("now"),
            StartAt::OldestAvailable => f.write_str("the oldest retained entry"),
        }
    }
}

/// One thing a cursor yields.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceItem {
    /// A raw change event, exactly as the server shapes it.
    Event(Document),
    /// A raw change event still in its BSON encoding, exactly as the server sent it. The engine
    /// decodes it on the stream's task ([`SourceItem::decode`]), so a source that reads ahead
    /// on a task of its own (the MongoDB backend) hands over one buffer per event and leaves
    /// the decoding, and the many small allocations it makes, to the task that later frees
    /// them. Bytes that are not a valid BSON document halt the stream (`SourceFatal`): the
    /// event cannot be identified, so it is never checkpointed past.
    Encoded(bson::RawDocumentBuf),
    /// The cursor read a batch with no events; the token is the post-batch resume token: a
    /// position at or after everything the server scanned, safe to resume after.
    Idle(Option<ResumeToken>),
}

impl SourceItem {
    /// The item with an [`SourceItem::Encoded`] event decoded into a [`SourceItem::Event`]
    /// (any other item as it is); fails when the bytes are not a valid BSON document.
    pub fn decode(self) -> Result<SourceItem, bson::raw::Error> {
        match self {
            SourceItem::Encoded(bytes) => Document::try_from(bytes).map(SourceItem::Event),
            other => Ok(other),
        }
    }
}

/// How the engine must treat a source error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceErrorKind {
    /// Transient (network, step-down, shutdown, cursor lost, auth hiccup): re-open from the
    /// settled position after the restart backoff.
    Resumable,
    /// The requested position is older than the retained history.
    HistoryLost,
    /// The token cannot be used to resume (for example `resumeAfter` an invalidate).
    InvalidToken,
    /// The server cannot continue this stream (for example code 280).
    Fatal,
    /// An event is larger than the server can return (code 10334).
    TooLarge,
    /// The stream definition is not acceptable to this source (for example an unsupported
    /// pipeline stage): fix the code.
    Configuration,
    /// [`StartAt::OldestAvailable`] was asked for but the source cannot tell where its oldest
    /// retained entry is (for example a MongoDB user without the privilege to read it). The
    /// stream halts (`HistoryLost`) instead of starting anywhere else: nothing is skipped.
    OldestUnknown,
}

/// An error from a change source.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("{kind:?} source error{}: {message}", code.map(|c| format!(" (code {c})")).unwrap_or_default())]
pub struct SourceError {
    /// Classification.
    pub kind: SourceErrorKind,
    /// The server's (or backend's) message.
    pub message: String,
    /// The server's error code, when there is one.
    pub code: Option<i32>,
}

impl SourceError {
    /// A new error.
    pub fn new(kind: SourceErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            code: None,
        }
    }

    /// Attaches the server's code.
    pub fn with_code(mut self, code: i32) -> Self {
        self.code = Some(code);
        self
    }
}

/// The retained history of a source at one moment: what lag and headroom are measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryBounds {
    /// Time of the oldest retained entry (the first entry of MongoDB's oplog).
    pub oldest: DateTime,
    /// Time of the newest entry (the last operation written).
    pub newest: DateTime,
}

/// Why a source cannot tell its history bounds (for example a MongoDB user without the
/// privilege to read the oplog); the runtime then reports lag as unknown and logs this once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HistoryUnknown(pub String);

/// The time of a cluster timestamp, to the second.
pub fn timestamp_time(ts: Timestamp) -> DateTime {
    DateTime::from_millis(i64::from(ts.time) * 1000)
}

/// A source of change events.
#[async_trait]
pub trait ChangeSource: Send + Sync + 'static {
    /// Opens a cursor for `spec` at `at`.
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError>;

    /// A short description for logs (`in-memory`, a redacted URI...).
    fn describe(&self) -> String;

    /// The times of the oldest and newest retained history entries, for lag and headroom.
    /// The default says the source cannot tell.
    async fn history_bounds(&self) -> Result<HistoryBounds, HistoryUnknown> {
        Err(HistoryUnknown(format!(
            "the source {} does not report its retained history",
            self.describe()
        )))
    }

    /// The time of a position of this source (an event's token or a post-batch token), on
    /// the clock of [`ChangeSource::history_bounds`]. The default decodes the cluster time
    /// MongoDB puts at the start of a token ([`ResumeToken::cluster_time`]); `None` when the
    /// position's time cannot be told.
    fn position_time(&self, position: &ResumeToken) -> Option<DateTime> {
        position.cluster_time().map(timestamp_time)
    }

    /// The next batch of an initial snapshot: at most `request.limit` documents of the
    /// collection that match `request.filter` and whose `_id` sorts after `request.after`,
    /// in `_id` order (MongoDB's order across types). An empty batch ends the scan. The
    /// default says the source cannot scan; a stream with `start_position = Snapshot` then
    /// halts with a configuration error before it reads anything.
    async fn scan(&self, request: &ScanRequest) -> Result<Vec<Document>, SourceError> {
        Err(SourceError::new(
            SourceErrorKind::Configuration,
            format!(
                "stream '{}': the source {} cannot read a collection's documents, so `start_position = Snapshot` is not available on it",
                request.stream,
                self.describe()
            ),
        ))
    }
}

/// An open cursor. The engine reads it from one task only and never drops a pending `next()`
/// it intends to continue (a cursor whose read was abandoned is discarded).
#[async_trait]
pub trait ChangeCursor: Send {
    /// The next event, or an idle tick after an empty batch; `Ok(None)` once the cursor is
    /// closed by the server (after an invalidate).
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError>;

    /// A position at which the cursor starts (for a cursor opened at "now" or at the oldest
    /// entry): resuming after it later continues without a gap even if no event was read.
    fn initial_position(&self) -> Option<ResumeToken> {
        None
    }

    /// Where the engine reads this cursor: the default, [`ReadMode::ReadAhead`], suits a cursor
    /// whose `next()` waits on a server; a cursor that answers from the process's own memory
    /// says [`ReadMode::InProcess`].
    fn read_mode(&self) -> ReadMode {
        ReadMode::ReadAhead
    }
}

/// Where the engine reads a cursor, chosen by the source for what its `next()` costs. Either
/// way the cursor is read from one place only, a pending `next()` is never dropped while the
/// session lasts, and a stop request or a heartbeat is noticed between any two events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReadMode {
    /// `next()` waits on I/O (a server round trip): the engine reads on a task of its own,
    /// ahead of the handler, so the wait overlaps handling; events cross to the stream's task
    /// in batches of up to the stream's `batch_size`.
    #[default]
    ReadAhead,
    /// `next()` answers from memory in this process (the in-memory backend): a task of its own
    /// would gain nothing but move every event between threads. The engine reads on the
    /// stream's own task: a serial stream reads one event when it takes it, a keyed stream
    /// reads alongside its handlers a few events at a time, so an event is still in the CPU
    /// cache when it is handled.
    InProcess,
}
