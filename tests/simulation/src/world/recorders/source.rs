//! The recording change source: every open (and the gap it may take), delivery and scan batch.

use flowwarden::port::{HistoryBounds, HistoryUnknown, ReadMode, ScanRequest, SourceErrorKind};

use super::*;

/// The in-memory change source, recording opens and deliveries.
pub(crate) struct RecSource {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

#[async_trait]
impl ChangeSource for RecSource {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        let head = self.memory.oplog_head();
        let first = self.memory.oplog_first_retained();
        let (oldest_unknown, sabotage) = {
            let w = self.world.lock();
            (w.settings.oldest_unknown, w.sabotage)
        };
        let result = if oldest_unknown && at == StartAt::OldestAvailable {
            if sabotage == Some(Sabotage::OldestBecomesNow) {
                // The old adapter: "cannot read local.oplog.rs" became an open at now.
                ChangeSource::open(&self.memory, spec, StartAt::Now).await
            } else {
                self.world.lock().stats.oldest_unknown_refusals += 1;
                let kind = if sabotage == Some(Sabotage::OldestUnknownAsTransient) {
                    SourceErrorKind::Resumable
                } else {
                    SourceErrorKind::OldestUnknown
                };
                Err(SourceError::new(
                    kind,
                    "the oldest retained position cannot be read (simulated: no access to local.oplog.rs, no serverStatus)",
                ))
            }
        } else {
            ChangeSource::open(&self.memory, spec, at.clone()).await
        };
        let summary = result.as_ref().map(|_| ()).map_err(Clone::clone);
        // Where the cursor starts: a delivery at or before it is the source moving back.
        let start = match &at {
            StartAt::ResumeAfter(t) | StartAt::StartAfter(t) => token_seq(t),
            StartAt::Now => Some(head),
            StartAt::OldestAvailable if oldest_unknown => Some(head),
            StartAt::OldestAvailable => Some(first.saturating_sub(1)),
            _ => None,
        };
        let inc = self.inc;
        // One look at the world: the next one judges a gap this open may have taken.
        let mut w = self.world.lock();
        let tag = w.tag(inc);
        w.on_cursor_open(inc);
        w.transaction_delivery(inc);
        w.on_open(&tag, &at, head, first, &summary);
        w.on_snapshot_open(inc, &at, summary.is_ok());
        match &summary {
            Ok(()) => w.last_open_refused_oldest = false,
            Err(_) if oldest_unknown && at == StartAt::OldestAvailable => {
                w.last_open_refused_oldest = true
            }
            Err(_) => {}
        }
        if let (Ok(_), StartAt::Now | StartAt::OldestAvailable, Some(st)) = (&result, &at, start) {
            let stored = w
                .last_written
                .as_ref()
                .map(|c| c.seen.max(c.processed))
                .unwrap_or_default();
            let delivered = w.max_delivered.get(&inc).copied();
            if stored.max(delivered).is_some_and(|c| st < c) {
                // Only a source that moved back (the rewind fault, past the retained history)
                // makes "now" or "the oldest entry" lie behind what was settled.
                let floor = w.rewound_to.entry(inc).or_insert(st);
                *floor = (*floor).min(st);
            }
        }
        let read_mode = if w.settings.read_in_process {
            ReadMode::InProcess
        } else {
            ReadMode::ReadAhead
        };
        drop(w);
        result.map(|inner| {
            Box::new(RecCursor {
                inner,
                world: self.world.clone(),
                last: start,
                tag,
                inc,
                read_mode,
            }) as Box<dyn ChangeCursor>
        })
    }

    fn describe(&self) -> String {
        "simulated in-memory".into()
    }

    async fn history_bounds(&self) -> Result<HistoryBounds, HistoryUnknown> {
        ChangeSource::history_bounds(&self.memory).await
    }

    fn position_time(&self, position: &ResumeToken) -> Option<bson::DateTime> {
        ChangeSource::position_time(&self.memory, position)
    }

    /// A scan batch takes the schedule's scan latency (a `find`'s round trip), then reads
    /// the collection as it is.
    async fn scan(&self, request: &ScanRequest) -> Result<Vec<Document>, SourceError> {
        let latency = self
            .world
            .lock()
            .settings
            .snapshot
            .as_ref()
            .map_or(0, |s| s.scan_latency_ms);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        let result = ChangeSource::scan(&self.memory, request).await;
        let head = self.memory.oplog_head();
        let mut w = self.world.lock();
        w.transaction_delivery(self.inc);
        w.on_scan(self.inc, request.after.as_ref(), &result, head);
        drop(w);
        result
    }
}

struct RecCursor {
    inner: Box<dyn ChangeCursor>,
    world: Arc<World>,
    /// The last position delivered (at first, where the cursor was opened).
    last: Option<u64>,
    tag: String,
    inc: u32,
    /// Where the engine reads this cursor (the schedule's draw).
    read_mode: ReadMode,
}

#[async_trait]
impl ChangeCursor for RecCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        let item = self.inner.next().await;
        let mut w = self.world.lock();
        match &item {
            // The in-memory cursor hands over decoded events; this recorder encodes them below.
            Ok(Some(SourceItem::Encoded(_))) => w.log(format!(
                "{}an encoded event from the in-memory cursor",
                self.tag
            )),
            Ok(Some(SourceItem::Event(raw))) => {
                if let Some(seq) = event_seq(raw) {
                    let invalidate = raw.get_str("operationType") == Ok("invalidate");
                    if !invalidate {
                        *w.deliveries.entry(seq).or_default() += 1;
                    }
                    if !invalidate && self.last.is_some_and(|l| seq <= l) {
                        w.log(format!(
                            "{}source moved back: #{seq} after #{}",
                            self.tag,
                            self.last.unwrap_or(0)
                        ));
                        let floor = w.rewound_to.entry(self.inc).or_insert(seq);
                        *floor = (*floor).min(seq);
                    }
                    if !invalidate {
                        self.last = Some(seq);
                        let max = w.max_delivered.entry(self.inc).or_insert(seq);
                        *max = (*max).max(seq);
                    }
                    w.on_delivered(self.inc, seq);
                    w.log(format!(
                        "{}deliver #{seq}{}",
                        self.tag,
                        if invalidate { " invalidate" } else { "" }
                    ));
                }
            }
            Ok(Some(SourceItem::Idle(Some(t)))) => {
                if let Some(seq) = token_seq(t) {
                    if self.last.is_some_and(|l| seq < l) {
                        w.log(format!(
                            "{}source moved back: idle at #{seq} after #{}",
                            self.tag,
                            self.last.unwrap_or(0)
                        ));
                        let floor = w.rewound_to.entry(self.inc).or_insert(seq);
                        *floor = (*floor).min(seq);
                    }
                    self.last = Some(seq);
                }
            }
            Ok(Some(SourceItem::Idle(None))) | Ok(None) => {}
            Err(e) => w.log(format!(
                "{}read error {:?}: {}",
                self.tag, e.kind, e.message
            )),
        }
        match item {
            // A cursor read ahead hands its events over still encoded, as MongoDB's does.
            Ok(Some(SourceItem::Event(raw))) if self.read_mode == ReadMode::ReadAhead => {
                bson::RawDocumentBuf::from_document(&raw)
                    .map(|bytes| Some(SourceItem::Encoded(bytes)))
                    .map_err(|e| {
                        SourceError::new(
                            SourceErrorKind::Fatal,
                            format!("{}the event cannot be encoded: {e}", self.tag),
                        )
                    })
            }
            other => other,
        }
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.inner.initial_position()
    }

    fn read_mode(&self) -> ReadMode {
        self.read_mode
    }
}
