//! Change streams over the in-memory oplog.

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use bson::{DateTime, Document};

use super::faults::ReadFault;
use super::oplog::{self, parse_token, OpKind};
use super::{MemoryBackend, DEFAULT_AWAIT};
use crate::definition::{FullDocument, FullDocumentBeforeChange};
use crate::event::ResumeToken;
use crate::matcher::pipeline::EventPipeline;
use crate::port::{
    ChangeCursor, ChangeSource, HistoryBounds, HistoryUnknown, ReadMode, ScanRequest, SourceError,
    SourceErrorKind, SourceItem, StartAt, WatchSpec,
};

/// MongoDB's wording, so logs read the same on both backends.
const HISTORY_LOST: &str =
    "Resume of change stream was not possible, as the resume point may no longer be in the oplog.";

fn history_lost() -> SourceError {
    SourceError::new(SourceErrorKind::HistoryLost, HISTORY_LOST).with_code(286)
}

fn invalid_token(why: &str) -> SourceError {
    SourceError::new(SourceErrorKind::InvalidToken, why).with_code(260)
}

/// A cursor over the in-memory oplog for one collection.
pub(crate) struct MemoryCursor {
    backend: MemoryBackend,
    db: String,
    coll: String,
    pipeline: EventPipeline,
    full_document: FullDocument,
    before: FullDocumentBeforeChange,
    batch_size: usize,
    max_await: Duration,
    /// Sequence number of the next oplog entry to read.
    next_seq: u64,
    pending: VecDeque<Document>,
    closed: bool,
    generation: u64,
    initial: Option<ResumeToken>,
}

#[async_trait]
impl ChangeSource for MemoryBackend {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        let pipeline = EventPipeline::parse(&spec.pipeline).map_err(|e| {
            SourceError::new(
                SourceErrorKind::Configuration,
                format!("stream '{}': unsupported pipeline: {e}", spec.stream),
            )
        })?;
        let db = spec
            .database
            .clone()
            .unwrap_or_else(|| self.default_database());
        let mut st = self.lock();
        let generation = st.faults.on_open()?;
        let first = st.first_retained();
        let head = st.next_seq - 1;
        let after_token = |t: &ResumeToken, allow_invalidate: bool| -> Result<u64, SourceError> {
            let p = parse_token(t).ok_or_else(|| invalid_token("malformed resume token"))?;
            if p.invalidate && !allow_invalidate {
                return Err(invalid_token(
                    "cannot resume a stream after an invalidate event with resumeAfter; use startAfter",
                ));
            }
            if p.seq > head {
                return Err(invalid_token("resume token is ahead of the oplog"));
            }
            if p.seq + 1 < first {
                return Err(history_lost());
            }
            Ok(p.seq + 1)
        };
        let (next_seq, initial) = match &at {
            StartAt::ResumeAfter(t) => (after_token(t, false)?, None),
            StartAt::StartAfter(t) => (after_token(t, true)?, None),
            StartAt::OperationTime(ts) => {
                let s = oplog::seq_at(*ts).max(1);
                if s < first {
                    return Err(history_lost());
                }
                (s, None)
            }
            StartAt::Now => (head + 1, Some(oplog::token(head))),
            StartAt::OldestAvailable => (first, Some(oplog::token(first - 1))),
        };
        // Resuming right after a drop or rename of the watched collection (not after its
        // invalidate) yields the invalidate next, as on the server.
        let mut pending = VecDeque::new();
        let mut closed = false;
        if let StartAt::ResumeAfter(_) | StartAt::StartAfter(_) = at {
            let invalidated = matches!(at, StartAt::ResumeAfter(ref t) | StartAt::StartAfter(ref t) if parse_token(t).is_some_and(|p| p.invalidate));
            if !invalidated {
                if let Some(prev) = st.entry(next_seq - 1) {
                    if prev.db == db
                        && prev.coll == spec.collection
                        && matches!(prev.kind, OpKind::Drop | OpKind::Rename { .. })
                    {
                        pending.push_back(prev.invalidate_event());
                        closed = true;
                    }
                }
            }
        }
        Ok(Box::new(MemoryCursor {
            backend: self.clone(),
            db,
            coll: spec.collection.clone(),
            pipeline,
            full_document: spec.full_document,
            before: spec.full_document_before_change,
            batch_size: spec.batch_size.max(1) as usize,
            max_await: if spec.max_await.is_zero() {
                DEFAULT_AWAIT
            } else {
                spec.max_await
            },
            next_seq,
            pending,
            closed,
            generation,
            initial,
        }))
    }

    fn describe(&self) -> String {
        "in-memory".into()
    }

    /// The write times of the oldest and newest retained entries (the backend's clock, virtual
    /// under `tokio::time::pause`). While no entry was ever dropped the oldest retained
    /// position is the one before the first write, whose time is the backend's creation (see
    /// [`ChangeSource::position_time`]): a stream that started there is still resumable, so
    /// the history reaches back to the creation. The newest is "now" while nothing was written.
    async fn history_bounds(&self) -> Result<HistoryBounds, HistoryUnknown> {
        let st = self.lock();
        let now = || self.wall_time();
        let oldest = if st.first_retained() == 1 {
            self.epoch_time()
        } else {
            st.oplog.front().map_or_else(now, |e| e.wall)
        };
        Ok(HistoryBounds {
            oldest,
            newest: st.oplog.back().map_or_else(now, |e| e.wall),
        })
    }

    /// The write time of the entry a token stands at; before the first write, the backend's
    /// creation; at the head of an emptied oplog, now. `None` once the entry is no longer
    /// retained.
    fn position_time(&self, position: &ResumeToken) -> Option<DateTime> {
        let seq = parse_token(position)?.seq;
        let st = self.lock();
        match st.entry(seq) {
            Some(e) => Some(e.wall),
            None if seq == 0 => Some(self.epoch_time()),
            None if seq + 1 >= st.next_seq && st.oplog.is_empty() => Some(self.wall_time()),
            None => None,
        }
    }

    /// The collection's documents in `_id` order (MongoDB's order across types), read under
    /// the backend's lock: one consistent batch.
    async fn scan(&self, request: &ScanRequest) -> Result<Vec<Document>, SourceError> {
        let db = request
            .database
            .clone()
            .unwrap_or_else(|| self.default_database());
        let mut st = self.lock();
        st.faults.on_scan()?;
        super::scan::scan(&st, &db, request)
    }
}

enum Scan {
    /// Nothing new in the oplog.
    AtHead,
    /// Entries were read; this is the last one read.
    Read(u64),
    /// The cursor fell behind the retained history.
    Lost,
}

impl MemoryCursor {
    fn scan(&mut self) -> Scan {
        let st = self.backend.lock();
        let first = st.first_retained();
        if self.next_seq < first {
            return Scan::Lost;
        }
        let start = (self.next_seq - first) as usize;
        let limit = self.batch_size * 16;
        let mut last = None;
        for entry in st.oplog.iter().skip(start).take(limit) {
            last = Some(entry.seq);
            self.next_seq = entry.seq + 1;
            if entry.db != self.db || entry.coll != self.coll {
                continue;
            }
            let current = match (self.full_document, &entry.kind) {
                (FullDocument::UpdateLookup, OpKind::Update(_)) => {
                    st.current_document(&entry.db, &entry.coll, entry.key.as_ref())
                }
                _ => None,
            };
            let event = entry.event(self.full_document, self.before, current.as_ref());
            if let Some(event) = self.pipeline.apply(event) {
                self.pending.push_back(event);
            }
            if matches!(entry.kind, OpKind::Drop | OpKind::Rename { .. }) {
                self.pending.push_back(entry.invalidate_event());
                self.closed = true;
                break;
            }
            if self.pending.len() >= self.batch_size {
                break;
            }
        }
        match last {
            Some(seq) => Scan::Read(seq),
            None => Scan::AtHead,
        }
    }

    /// Applies injected faults; `Err` ends this read.
    fn faults(&mut self) -> Result<Option<Duration>, SourceError> {
        let fault = self.backend.lock().faults.on_read(self.generation);
        match fault {
            ReadFault::Proceed(delay) => Ok(delay),
            #[cfg(feature = "test-util")]
            ReadFault::Fail(e) => Err(e),
            #[cfg(feature = "test-util")]
            ReadFault::Killed(e) => {
                self.generation = u64::MAX;
                Err(e)
            }
            #[cfg(feature = "test-util")]
            ReadFault::Rewind {
                generation,
                events,
                delay,
            } => {
                // Move back from the first event not yet delivered (scanned events waiting in
                // `pending` were never seen by the reader: clearing them must not skip them).
                let undelivered = self
                    .pending
                    .front()
                    .and_then(|ev| ev.get_document("_id").ok())
                    .and_then(|t| parse_token(&ResumeToken::from_document(t.clone())))
                    .map(|p| p.seq)
                    .unwrap_or(self.next_seq);
                self.next_seq = undelivered.saturating_sub(events).max(1);
                self.pending.clear();
                self.closed = false;
                self.generation = generation;
                Ok(delay)
            }
        }
    }
}

#[async_trait]
impl ChangeCursor for MemoryCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        let mut waited = false;
        loop {
            if let Some(delay) = self.faults()? {
                tokio::time::sleep(delay).await;
            }
            if let Some(ev) = self.pending.pop_front() {
                return Ok(Some(SourceItem::Event(ev)));
            }
            if self.closed {
                return Ok(None);
            }
            let shared = self.backend.shared().clone();
            let notified = shared.appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.scan() {
                Scan::Lost => return Err(history_lost()),
                Scan::Read(_) if !self.pending.is_empty() => continue,
                Scan::Read(last) => return Ok(Some(SourceItem::Idle(Some(oplog::token(last))))),
                Scan::AtHead if waited => {
                    let head = self.next_seq - 1;
                    return Ok(Some(SourceItem::Idle(Some(oplog::token(head)))));
                }
                Scan::AtHead => {
                    waited = true;
                    let _ = tokio::time::timeout(self.max_await, notified).await;
                }
            }
        }
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.initial.clone()
    }

    fn read_mode(&self) -> ReadMode {
        ReadMode::InProcess
    }
}

impl super::State {
    fn entry(&self, seq: u64) -> Option<&oplog::Entry> {
        let first = self.first_retained();
        if seq < first {
            return None;
        }
        self.oplog.get((seq - first) as usize)
    }
}
