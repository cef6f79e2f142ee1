//! The change source: `watch()` on the stream's collection, read as raw documents.
//!
//! The driver traps this design follows (see `docs/mongodb.md`):
//! - events are read still encoded (`RawDocumentBuf`), so the driver never fails to decode one
//!   after it has moved its cached token past it; the runtime decodes them, on the stream's
//!   task rather than this cursor's reader (see `SourceItem::Encoded`), into the user's type;
//! - the cursor is read with `next_if_any()` in a plain loop, from the engine's one reader
//!   task; no `next()` is raced against a timer or dropped mid-flight;
//! - an empty batch becomes an idle tick carrying the post-batch resume token, so quiet and
//!   filter-heavy streams advance their settled position.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bson::{doc, Bson, Document, RawDocumentBuf, Timestamp};
use flowwarden::port::{
    ChangeCursor, ChangeSource, HistoryBounds, HistoryUnknown, ScanRequest, SourceError,
    SourceErrorKind, SourceItem, StartAt, WatchSpec,
};
use flowwarden::{FullDocument, FullDocumentBeforeChange, ResumeToken};
use mongodb::change_stream::ChangeStream;
use mongodb::options::{FullDocumentBeforeChangeType, FullDocumentType};
use tracing::{debug, warn};

use crate::classify::classify;
use crate::resumes::DriverResumes;
use crate::token::{from_driver, to_driver};
use crate::MongoBackend;

/// The stage that asks the server to split events over 16 MB into fragments.
pub const SPLIT_STAGE: &str = "$changeStreamSplitLargeEvent";

/// An open change stream of one collection (see the module documentation).
pub struct MongoCursor {
    stream: ChangeStream<RawDocumentBuf>,
    name: &'static str,
    initial: Option<ResumeToken>,
    /// Whether the pipeline ends with `$changeStreamSplitLargeEvent`.
    split: bool,
    /// Fragments of a split event read so far.
    assembler: Reassembler,
    /// Items ready to hand out (reassembled events).
    ready: VecDeque<Document>,
    /// Whether an `invalidate` event was handed out (the cursor then closes).
    saw_invalidate: bool,
    /// This open's driver-resume accounting, when the client is monitored.
    monitor: Option<OpenMonitor>,
}

/// One open's share of the driver-resume count (see `resumes.rs`).
struct OpenMonitor {
    resumes: Arc<DriverResumes>,
    comment: String,
    /// Aggregates run under this open's comment, counted by the command monitor.
    aggregates: Arc<AtomicU64>,
    /// How many of them are accounted for (the open's own first).
    seen: u64,
}

impl Drop for MongoCursor {
    fn drop(&mut self) {
        if let Some(m) = &self.monitor {
            m.resumes.forget(&m.comment);
        }
    }
}

impl MongoCursor {
    /// Reports the aggregates the driver ran under this open's comment since the last look:
    /// each is a resume the runtime did not decide. One atomic read when there is none.
    fn account_driver_resumes(&mut self) {
        let Some(m) = &mut self.monitor else {
            return;
        };
        let now = m.aggregates.load(Ordering::Relaxed);
        if now > m.seen {
            let n = now - m.seen;
            m.seen = now;
            let total = m.resumes.add_resumes(self.name, n);
            metrics::counter!("flowwarden.source.driver_resumes", "stream" => self.name)
                .increment(n);
            warn!(stream = self.name, resumes = n, total, "the driver resumed the change stream on its own after a resumable error (no restart counted, no backoff applied; nothing is lost: it resumes after the last event it returned)");
        }
    }
}

impl std::fmt::Debug for MongoCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoCursor")
            .field("stream", &self.name)
            .field("split", &self.split)
            .finish()
    }
}

fn full_document(f: FullDocument) -> Option<FullDocumentType> {
    match f {
        FullDocument::Default => None,
        FullDocument::UpdateLookup => Some(FullDocumentType::UpdateLookup),
        FullDocument::WhenAvailable => Some(FullDocumentType::WhenAvailable),
        FullDocument::Required => Some(FullDocumentType::Required),
    }
}

fn before_change(f: FullDocumentBeforeChange) -> Option<FullDocumentBeforeChangeType> {
    match f {
        FullDocumentBeforeChange::Off => None,
        FullDocumentBeforeChange::WhenAvailable => {
            Some(FullDocumentBeforeChangeType::WhenAvailable)
        }
        FullDocumentBeforeChange::Required => Some(FullDocumentBeforeChangeType::Required),
    }
}

/// Whether `pipeline` asks for split events; a split stage anywhere but last is a
/// configuration error.
fn split_requested(stream: &str, pipeline: &[Document]) -> Result<bool, SourceError> {
    let is_split = |d: &Document| d.contains_key(SPLIT_STAGE);
    let n = pipeline.len();
    if let Some(i) = pipeline.iter().position(is_split) {
        if i + 1 != n {
            return Err(SourceError::new(
                SourceErrorKind::Configuration,
                format!("stream '{stream}': {SPLIT_STAGE} must be the last stage of the pipeline (it is stage {} of {n})", i + 1),
            ));
        }
        return Ok(true);
    }
    Ok(false)
}

impl MongoBackend {
    /// The time of the oldest retained oplog entry, read from `local.oplog.rs` (needs `find` on
    /// the `local` database). `None` when the collection returns nothing: an empty oplog, or a
    /// `mongos`, where `local.oplog.rs` is not the shards' oplog.
    pub async fn oldest_oplog_time(&self) -> Result<Option<Timestamp>, mongodb::error::Error> {
        self.oplog_entry_time(1).await
    }

    /// The time of the oldest retained oplog entry as `serverStatus` reports it
    /// (`{serverStatus: 1, oplog: 1}`, section `oplog.earliestOptime`; needs the
    /// `serverStatus` action, granted by `clusterMonitor`). `None` when the reply has no such
    /// section (a `mongos`, a standalone).
    pub async fn earliest_optime(&self) -> Result<Option<Timestamp>, mongodb::error::Error> {
        Ok(self.server_status_optimes().await?.0)
    }

    /// Where the oldest retained entry is: `local.oplog.rs` first, then `serverStatus`. When
    /// neither can tell, the error explains each attempt; the caller must not guess.
    async fn oldest_retained(&self, stream: &str) -> Result<Timestamp, SourceError> {
        let oplog = match self.oldest_oplog_time().await {
            Ok(Some(ts)) => return Ok(ts),
            Ok(None) => "local.oplog.rs returned no entry (an empty oplog, or a mongos)".to_owned(),
            Err(e) => format!(
                "reading local.oplog.rs failed ({}; it needs `find` on the local database)",
                crate::short_error(&e)
            ),
        };
        let status = match self.earliest_optime().await {
            Ok(Some(ts)) => {
                debug!(
                    stream,
                    "oldest retained entry read from serverStatus (oplog.earliestOptime)"
                );
                return Ok(ts);
            }
            Ok(None) => {
                "serverStatus has no oplog.earliestOptime (a mongos or a standalone)".to_owned()
            }
            Err(e) => format!(
                "serverStatus failed ({}; it needs the serverStatus action, role clusterMonitor)",
                crate::short_error(&e)
            ),
        };
        Err(SourceError::new(
            SourceErrorKind::OldestUnknown,
            format!("stream '{stream}': the oldest retained oplog entry cannot be determined: {oplog}; {status}. Grant one of these privileges (docs/mongodb.md, Privileges) or choose on_history_lost = ResumeFromNow"),
        ))
    }
}

#[async_trait]
impl ChangeSource for MongoBackend {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        if at != StartAt::Now {
            return Ok(Box::new(self.open_cursor(spec, at).await?));
        }
        // At "now", the first `aggregate` asks for an empty first batch (`batchSize: 0`): its
        // post-batch token is then the stream's start, which the driver reports only for an
        // empty first batch. With a non-zero batch size, writes committing while the server
        // opens the stream arrive in the first batch, no start position is known, and a crash
        // before the first checkpoint would re-open at a later "now" and skip them.
        let probe = WatchSpec {
            batch_size: 0,
            ..spec.clone()
        };
        let cursor = self.open_cursor(&probe, StartAt::Now).await?;
        // Never keep a cursor opened without a start option: when the driver's own resume
        // (after a resumable `getMore` error) has its `aggregate` retried, the retry has lost
        // the cached token and falls back to the original options, a later "now", skipping
        // what came in between. Re-opened `resumeAfter` the initial position, the same retry
        // replays from there instead.
        let Some(initial) = cursor.initial.clone() else {
            // Only a server that ignores `batchSize: 0` gets here (see docs/mongodb.md).
            warn!(stream = spec.stream, "the change stream opened at now reported no start position (a non-empty first batch despite batchSize 0); a crash before the first checkpoint may re-open at a later now");
            return Ok(Box::new(cursor));
        };
        drop(cursor);
        let mut cursor = self
            .open_cursor(spec, StartAt::ResumeAfter(initial.clone()))
            .await?;
        cursor.initial = Some(initial);
        Ok(Box::new(cursor))
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn history_bounds(&self) -> Result<HistoryBounds, HistoryUnknown> {
        self.oplog_bounds().await
    }

    /// One `find` per batch in `_id` order (see `scan.rs`).
    async fn scan(&self, request: &ScanRequest) -> Result<Vec<Document>, SourceError> {
        self.scan_batch(request).await
    }
}

impl MongoBackend {
    /// Opens the change stream of `spec` at `at`.
    async fn open_cursor(&self, spec: &WatchSpec, at: StartAt) -> Result<MongoCursor, SourceError> {
        let split = split_requested(spec.stream, &spec.pipeline)?;
        let db = spec.database.as_deref().unwrap_or(&self.database);
        let coll = self
            .client
            .database(db)
            .collection::<Document>(&spec.collection);
        // 0 only for the first open at "now" (see `open`); the runtime never asks for 0.
        let mut watch = coll.watch().batch_size(spec.batch_size);
        if let Some(f) = full_document(spec.full_document) {
            watch = watch.full_document(f);
        }
        if let Some(f) = before_change(spec.full_document_before_change) {
            watch = watch.full_document_before_change(f);
        }
        if !spec.max_await.is_zero() {
            watch = watch.max_await_time(spec.max_await);
        }

        let at = match at {
            // Never "now" in place of the oldest entry: that would skip the retained history.
            StartAt::OldestAvailable => {
                StartAt::OperationTime(self.oldest_retained(spec.stream).await?)
            }
            other => other,
        };
        watch = match &at {
            StartAt::ResumeAfter(t) => watch.resume_after(to_driver(t)?),
            StartAt::StartAfter(t) => watch.start_after(to_driver(t)?),
            StartAt::OperationTime(ts) => watch.start_at_operation_time(*ts),
            StartAt::Now | StartAt::OldestAvailable => watch,
        };
        // A no-op first stage that tags this open's aggregates (the driver's resumes repeat
        // it), so the command monitor can count the resumes (see `resumes.rs`). Registered
        // last, so only the aggregate below can fail with it registered.
        let registered = self.resumes.as_ref().map(|r| (r, r.register(spec.stream)));
        let pipeline = registered
            .iter()
            .map(|(_, (c, _))| doc! { "$match": { "$comment": c.as_str() } })
            .chain(spec.pipeline.iter().cloned());
        let stream = watch.pipeline(pipeline).await.map_err(|e| {
            if let Some((resumes, (comment, _))) = &registered {
                resumes.forget(comment);
            }
            let mut err = classify(&e);
            err.message = format!(
                "stream '{}': opening the change stream at {at} failed: {}",
                spec.stream, err.message
            );
            err
        })?;
        // Raw documents, still encoded: the runtime decodes (driver trap 1), on the stream's
        // task.
        let stream = stream.with_type::<RawDocumentBuf>();
        // Right after the open, the driver's token is the post-batch token of an empty first
        // batch (or the token we resumed from): a position without a gap.
        let initial = match &at {
            StartAt::Now | StartAt::OperationTime(_) => {
                stream.resume_token().as_ref().and_then(from_driver)
            }
            _ => None,
        };
        debug!(stream = spec.stream, %at, split, "change stream opened");
        Ok(MongoCursor {
            stream,
            name: spec.stream,
            initial,
            split,
            assembler: Reassembler::new(spec.stream),
            ready: VecDeque::new(),
            saw_invalidate: false,
            monitor: registered.map(|(resumes, (comment, aggregates))| OpenMonitor {
                resumes: resumes.clone(),
                comment,
                seen: aggregates.load(Ordering::Relaxed),
                aggregates,
            }),
        })
    }
}

fn split_info(event: &Document) -> Option<(i64, i64)> {
    let s = event.get_document("splitEvent").ok()?;
    let n = |k: &str| match s.get(k) {
        Some(Bson::Int32(i)) => Some(i64::from(*i)),
        Some(Bson::Int64(i)) => Some(*i),
        _ => None,
    };
    Some((n("fragment")?, n("of")?))
}

/// Reassembles the fragments of split events (`splitEvent {fragment, of}`) into whole events
/// carrying the last fragment's `_id`.
#[derive(Debug)]
pub(crate) struct Reassembler {
    name: &'static str,
    /// The merged event so far, the next fragment number, the number of fragments.
    partial: Option<(Document, i64, i64)>,
}

impl Reassembler {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            partial: None,
        }
    }

    pub(crate) fn in_progress(&self) -> bool {
        self.partial.is_some()
    }

    fn fatal(&self, what: String) -> SourceError {
        SourceError::new(
            SourceErrorKind::Fatal,
            format!("stream '{}': {what}", self.name),
        )
    }

    /// Adds a fragment; returns the whole event once the last fragment is in.
    pub(crate) fn push(&mut self, mut event: Document) -> Result<Option<Document>, SourceError> {
        let Some((fragment, of)) = split_info(&event) else {
            if self.partial.is_some() {
                return Err(
                    self.fatal("a whole event arrived while a split event was incomplete".into())
                );
            }
            return Ok(Some(event));
        };
        event.remove("splitEvent");
        match self.partial.take() {
            None if fragment == 1 => self.partial = Some((event, 2, of)),
            None => {
                return Err(self.fatal(format!(
                    "fragment {fragment} of {of} of a split event arrived without the fragments before it"
                )))
            }
            Some((mut merged, expected, total)) if fragment == expected && of == total => {
                for (k, v) in event {
                    if k == "_id" {
                        // The last fragment's token: the checkpoint may pass the event only
                        // once all of it is settled.
                        merged.insert("_id", v);
                    } else {
                        merged.insert(k, v);
                    }
                }
                self.partial = Some((merged, expected + 1, total));
            }
            Some((_, expected, total)) => {
                return Err(self.fatal(format!(
                    "fragment {fragment} of {of} of a split event arrived, expected {expected} of {total}"
                )))
            }
        }
        match &self.partial {
            Some((_, next, total)) if *next > *total => {
                Ok(self.partial.take().map(|(merged, _, _)| merged))
            }
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl ChangeCursor for MongoCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                return Ok(Some(SourceItem::Event(ev)));
            }
            let read = self.stream.next_if_any().await;
            self.account_driver_resumes();
            match read {
                Ok(Some(event)) => {
                    if event.get_document("_id").is_err() {
                        return Err(SourceError::new(
                            SourceErrorKind::Configuration,
                            format!("stream '{}': a change event has no `_id` resume token (the pipeline must not remove or alter `_id`)", self.name),
                        ));
                    }
                    if event.get_str("operationType") == Ok("invalidate") {
                        self.saw_invalidate = true;
                    }
                    if !self.split {
                        return Ok(Some(SourceItem::Encoded(event)));
                    }
                    let event = Document::try_from(event).map_err(|e| {
                        SourceError::new(
                            SourceErrorKind::Fatal,
                            format!(
                                "stream '{}': a change event is not valid BSON: {e}",
                                self.name
                            ),
                        )
                    })?;
                    if let Some(whole) = self.assembler.push(event)? {
                        self.ready.push_back(whole);
                    }
                }
                Ok(None) if !self.stream.is_alive() => {
                    // The server closed the cursor (after an invalidate) and every buffered
                    // event was handed over.
                    if self.assembler.in_progress() {
                        return Err(SourceError::new(
                            SourceErrorKind::Resumable,
                            format!(
                                "stream '{}': the cursor closed in the middle of a split event",
                                self.name
                            ),
                        ));
                    }
                    if !self.saw_invalidate {
                        // A change stream cursor closes only after an invalidate: the pipeline
                        // filtered the event out, and the post-batch token is its token. Hand
                        // the invalidate over, or the runtime would re-open in a loop.
                        if let Some(token) =
                            self.stream.resume_token().as_ref().and_then(from_driver)
                        {
                            self.saw_invalidate = true;
                            warn!(stream = self.name, "the server closed the change stream after an invalidate that the stream's pipeline filtered out; treating it as the invalidate (keep `invalidate` in any operationType $match)");
                            return Ok(Some(SourceItem::Event(
                                doc! { "_id": token.as_document().clone(), "operationType": "invalidate" },
                            )));
                        }
                    }
                    return Ok(None);
                }
                Ok(None) => {
                    if self.assembler.in_progress() {
                        // The post-batch token would pass fragments not yet handed over.
                        continue;
                    }
                    let token = self.stream.resume_token().as_ref().and_then(from_driver);
                    return Ok(Some(SourceItem::Idle(token)));
                }
                Err(e) => {
                    let mut err = classify(&e);
                    err.message = format!("stream '{}': {}", self.name, err.message);
                    return Err(err);
                }
            }
        }
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.initial.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_stage_must_be_last() {
        let m = doc! {"$match": {}};
        let s = doc! {SPLIT_STAGE: {}};
        assert_eq!(split_requested("s", std::slice::from_ref(&m)), Ok(false));
        assert_eq!(split_requested("s", &[m.clone(), s.clone()]), Ok(true));
        let e = split_requested("s", &[s, m]).unwrap_err();
        assert_eq!(e.kind, SourceErrorKind::Configuration);
    }

    #[test]
    fn fragments_are_reassembled_with_the_last_token() {
        let mut r = Reassembler::new("s");
        let f1 = doc! {"_id": {"_data": "01"}, "splitEvent": {"fragment": 1, "of": 3}, "operationType": "insert", "fullDocument": {"a": 1}};
        let f2 = doc! {"_id": {"_data": "02"}, "splitEvent": {"fragment": 2, "of": 3}, "fullDocumentBeforeChange": {"b": 1}};
        let f3 = doc! {"_id": {"_data": "03"}, "splitEvent": {"fragment": 3, "of": 3}, "updateDescription": {"c": 1}};
        assert_eq!(r.push(f1), Ok(None));
        assert!(r.in_progress());
        assert_eq!(r.push(f2), Ok(None));
        let whole = r.push(f3).expect("ok").expect("complete");
        assert!(!r.in_progress());
        assert_eq!(
            whole,
            doc! {"_id": {"_data": "03"}, "operationType": "insert", "fullDocument": {"a": 1}, "fullDocumentBeforeChange": {"b": 1}, "updateDescription": {"c": 1}}
        );
        let plain = doc! {"_id": {"_data": "04"}, "operationType": "delete"};
        assert_eq!(r.push(plain.clone()), Ok(Some(plain)));
    }

    #[test]
    fn out_of_order_fragments_are_refused() {
        let mut r = Reassembler::new("s");
        let f2 = doc! {"_id": {"_data": "02"}, "splitEvent": {"fragment": 2, "of": 3}};
        assert_eq!(r.push(f2).unwrap_err().kind, SourceErrorKind::Fatal);
    }
}
