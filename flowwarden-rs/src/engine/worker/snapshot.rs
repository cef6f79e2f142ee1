//! The initial snapshot of a stream with `start_position = Snapshot`: record the change-stream
//! position first, read the collection in `_id` order handing every document to the handlers
//! as a snapshot read, keep the scan's progress in the checkpoint, and hand over to the stream
//! at the recorded position only once it is confirmed to be still in the retained history.
//!
//! Changes made while the scan runs are delivered by the stream afterwards: a document may be
//! seen twice (scanned, then its change), none is missed. The scan hands documents over one
//! at a time, whatever the stream's `concurrency`.

use bson::DateTime;
use tokio::time::Instant;
use tracing::{info, warn, Instrument};

use super::backoff::stopped;
use super::session::{event_span, sleep_until};
use super::Worker;
use crate::definition::StartPosition;
use crate::engine::process::{process_event, EventOutcome, ProcessCx};
use crate::engine::snapshot::pushdown::{scan_filter, ScanFilter};
use crate::engine::transaction::TxnCx;
use crate::engine::StreamExit;
use crate::event::{ChangeEvent, Namespace};
use crate::handler::StreamHandler;
use crate::port::{
    Checkpoint, ScanRequest, SnapshotProgress, SourceErrorKind, StartAt, StoredPosition,
};
use crate::status::{Halt, HaltReason, StreamState};

/// How one scanned document ended.
enum Read {
    /// Settled (handled, filtered out, dead-lettered); `save_now` as the handler asked;
    /// `committed` when a transaction stored the progress with the handler's writes.
    Settled { save_now: bool, committed: bool },
    /// The stream halts; the document stays unsettled.
    Halt(Halt),
    /// A stop was requested and the handler did not finish within the shutdown timeout.
    Abandoned,
}

impl<H: StreamHandler> Worker<H> {
    /// Runs (or continues) the initial snapshot when the stream asks for one and has no
    /// stored position yet; returns the checkpoint the stream resumes from.
    pub(super) async fn initial_snapshot(
        &mut self,
        stored: Option<Checkpoint>,
    ) -> Result<Option<Checkpoint>, StreamExit> {
        if self.def.checkpoint.start_position != StartPosition::Snapshot {
            return Ok(stored);
        }
        let name = self.def.name;
        let progress = match stored {
            Some(Checkpoint {
                snapshot: Some(progress),
                ..
            }) => {
                info!(stream = name, scanned = progress.scanned, start = %progress.start.token, "continuing the unfinished initial snapshot after the last settled document");
                #[cfg(feature = "test-util")]
                let progress = if self.env.options.snapshot_rescan_from_zero {
                    SnapshotProgress {
                        last_id: None,
                        scanned: 0,
                        ..progress
                    }
                } else {
                    progress
                };
                progress
            }
            Some(c) if c.last_processed.is_some() || c.last_seen.is_some() => return Ok(Some(c)),
            _ => self.record_snapshot_start().await?,
        };
        self.env.status.set_state(StreamState::Running);
        let progress = self.scan(progress).await?;
        #[cfg(feature = "test-util")]
        let progress = if self.env.options.snapshot_start_after_scan {
            // The sabotage: the start position taken again after the scan.
            SnapshotProgress {
                start: self.record_snapshot_start().await?.start,
                ..progress
            }
        } else {
            progress
        };
        self.confirm_snapshot_start(&progress).await?;
        let checkpoint = Checkpoint {
            stream: self.env.checkpoint_key.clone(),
            last_processed: None,
            last_seen: Some(progress.start.clone()),
            owner: None,
            epoch: None,
            updated_at: DateTime::now(),
            snapshot: None,
        };
        self.persist_checkpoint(checkpoint.clone(), "the completed snapshot")
            .await?;
        info!(
            stream = name,
            documents = progress.scanned,
            "initial snapshot complete; streaming the changes made since it began"
        );
        Ok(Some(checkpoint))
    }

    /// Opens the change stream at "now" only to take its start position, and stores it as
    /// the snapshot's start before any document is read.
    async fn record_snapshot_start(&mut self) -> Result<SnapshotProgress, StreamExit> {
        let spec = self.spec();
        let token = loop {
            if self.stop_requested() {
                return Err(StreamExit::Stopped);
            }
            match self.env.source.open(&spec, StartAt::Now).await {
                Ok(cursor) => match cursor.initial_position() {
                    Some(token) => break token,
                    None => {
                        return Err(StreamExit::Halted(Halt::new(
                            HaltReason::Configuration,
                            format!(
                                "stream '{}': the source {} reports no start position for a new change stream, so `start_position = Snapshot` cannot record where the stream must begin after the scan",
                                self.def.name,
                                self.env.source.describe()
                            ),
                        )))
                    }
                },
                Err(e) if e.kind == SourceErrorKind::Resumable => self.backoff(&e).await?,
                Err(e) => return Err(StreamExit::Halted(self.fatal(&e))),
            }
        };
        self.restart_failures = 0;
        let progress = SnapshotProgress {
            start: StoredPosition {
                cluster_time: token.cluster_time(),
                token,
                wall_time: None,
                start_after: false,
            },
            last_id: None,
            scanned: 0,
            started_at: DateTime::now(),
        };
        info!(stream = self.def.name, start = %progress.start.token, "initial snapshot: change-stream start position recorded; scanning the collection");
        self.persist_checkpoint(self.snapshot_checkpoint(&progress), "the snapshot's start")
            .await?;
        Ok(progress)
    }

    fn snapshot_checkpoint(&self, progress: &SnapshotProgress) -> Checkpoint {
        Checkpoint {
            stream: self.env.checkpoint_key.clone(),
            last_processed: None,
            last_seen: None,
            owner: None,
            epoch: None,
            updated_at: DateTime::now(),
            snapshot: Some(progress.clone()),
        }
    }

    fn stamped(&self, mut checkpoint: Checkpoint) -> Checkpoint {
        self.progress.stamp(&mut checkpoint);
        checkpoint
    }

    /// Writes the scan's progress; a refused write is retried at the next opportunity.
    async fn save_snapshot(&mut self, progress: &SnapshotProgress) -> Result<bool, StreamExit> {
        let checkpoint = self.snapshot_checkpoint(progress);
        self.progress
            .write(checkpoint)
            .await
            .map_err(StreamExit::Halted)
    }

    /// Reads the collection batch by batch from where `progress` stands; returns the final
    /// progress once a batch comes back empty.
    async fn scan(
        &mut self,
        mut progress: SnapshotProgress,
    ) -> Result<SnapshotProgress, StreamExit> {
        let name = self.def.name;
        let ScanFilter { filter, left_out } = scan_filter(&H::pipeline());
        if !left_out.is_empty() {
            info!(stream = name, left_out = ?left_out, "initial snapshot: these #[pipeline] conditions cannot be applied to the scan (documents they would reject reach the #[filter] and the insert handler)");
        }
        let spec = self.spec();
        let namespace = Namespace {
            db: spec.database.clone().unwrap_or_default(),
            coll: Some(spec.collection.clone()),
        };
        let save_every = u64::from(self.def.checkpoint.save_every_n.max(1));
        let mut unsaved: u64 = 0;
        loop {
            if self.stop_requested() {
                self.save_snapshot(&progress).await?;
                return Err(StreamExit::Stopped);
            }
            self.check_snapshot_history(&progress).await?;
            let request = ScanRequest {
                stream: name,
                database: spec.database.clone(),
                collection: spec.collection.clone(),
                filter: filter.clone(),
                after: progress.last_id.clone(),
                limit: spec.batch_size.max(1),
            };
            let batch = match self.env.source.scan(&request).await {
                Ok(batch) => batch,
                Err(e) if e.kind == SourceErrorKind::Resumable => {
                    self.backoff(&e).await?;
                    continue;
                }
                Err(e) => return Err(StreamExit::Halted(self.fatal(&e))),
            };
            self.restart_failures = 0;
            self.env.status.set_state(StreamState::Running);
            if batch.is_empty() {
                break;
            }
            for document in batch {
                let id = document.get("_id").cloned();
                let event =
                    match ChangeEvent::snapshot_read(&namespace, &progress.start.token, document) {
                        Ok(event) => event,
                        Err(e) => {
                            self.save_snapshot(&progress).await?;
                            return Err(StreamExit::Halted(Halt::new(
                                HaltReason::SourceFatal,
                                format!("stream '{name}': the initial snapshot cannot go on: {e}"),
                            )));
                        }
                    };
                // A transactional stream commits the progress past this document with its
                // writes.
                let after = self.env.transactions.is_some().then(|| {
                    let mut after = progress.clone();
                    after.last_id = id.clone();
                    after.scanned += 1;
                    self.stamped(self.snapshot_checkpoint(&after))
                });
                let (save_now, committed) = match self.read_one(event, after).await {
                    Read::Settled {
                        save_now,
                        committed,
                    } => (save_now, committed),
                    Read::Halt(h) => {
                        self.save_snapshot(&progress).await?;
                        return Err(StreamExit::Halted(h));
                    }
                    Read::Abandoned => {
                        self.save_snapshot(&progress).await?;
                        return Err(StreamExit::Stopped);
                    }
                };
                progress.last_id = id;
                progress.scanned += 1;
                unsaved += 1;
                // A committed transaction stored this progress already.
                if committed
                    || ((unsaved >= save_every || save_now)
                        && self.save_snapshot(&progress).await?)
                {
                    unsaved = 0;
                }
                if self.stop_requested() {
                    self.save_snapshot(&progress).await?;
                    return Err(StreamExit::Stopped);
                }
            }
        }
        if unsaved > 0 {
            self.persist_checkpoint(
                self.snapshot_checkpoint(&progress),
                "the snapshot's progress",
            )
            .await?;
        }
        Ok(progress)
    }

    /// Hands one scanned document to the handlers (filter, route, retries, dead letter),
    /// waiting for it on a stop up to the shutdown timeout, as the stream does for an event.
    async fn read_one(&mut self, event: ChangeEvent, after: Option<Checkpoint>) -> Read {
        let name = self.def.name;
        self.env.status.count_received(None);
        let transactions = self.env.transactions.clone();
        let mut recorded = after.clone();
        let txn = transactions.as_ref().map(|store| TxnCx {
            store,
            checkpoint: after.map(Box::new),
            #[cfg(feature = "test-util")]
            hook: self.env.options.transaction_hook.as_ref(),
        });
        let cx = ProcessCx::new(self.def, &self.env, &self.metrics, txn);
        let span = event_span(&event);
        let mut stop = self.env.stop.clone();
        let mut deadline: Option<Instant> = None;
        let fut = process_event(&self.handler, &event, None, &cx, &mut self.rng).instrument(span);
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                outcome = &mut fut => {
                    return match outcome {
                        EventOutcome::Settled { save_now, committed, .. } => {
                            if let Some(checkpoint) = recorded.take().filter(|_| committed) {
                                self.progress.committed(checkpoint);
                            }
                            Read::Settled { save_now, committed }
                        }
                        EventOutcome::Halt(h) => {
                            if h.reason == HaltReason::TransactionOutcomeUnknown {
                                self.progress.freeze();
                            }
                            Read::Halt(h)
                        }
                    };
                }
                _ = stopped(&mut stop), if deadline.is_none() => {
                    deadline = Some(Instant::now() + self.env.options.shutdown_timeout);
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    warn!(stream = name, token = %event.token(), "the in-flight handler did not finish within the shutdown timeout; the scanned document stays unsettled and will be read again");
                    if transactions.is_some() {
                        self.progress.freeze();
                    }
                    return Read::Abandoned;
                }
            }
        }
    }

    /// Halts as soon as the source tells that the recorded start is older than its retained
    /// history: the scan could never hand over to the stream without a gap.
    async fn check_snapshot_history(
        &mut self,
        progress: &SnapshotProgress,
    ) -> Result<(), StreamExit> {
        let Some(start) = self.env.source.position_time(&progress.start.token) else {
            return Ok(());
        };
        match self.env.source.history_bounds().await {
            Ok(bounds) if start < bounds.oldest => Err(self.snapshot_history_lost(progress)),
            _ => Ok(()),
        }
    }

    /// Opens the stream at the recorded start once: the source confirms that it is still in
    /// the retained history before the snapshot is declared complete.
    async fn confirm_snapshot_start(
        &mut self,
        progress: &SnapshotProgress,
    ) -> Result<(), StreamExit> {
        let spec = self.spec();
        loop {
            if self.stop_requested() {
                return Err(StreamExit::Stopped);
            }
            let at = StartAt::ResumeAfter(progress.start.token.clone());
            match self.env.source.open(&spec, at).await {
                Ok(_cursor) => return Ok(()),
                Err(e)
                    if matches!(
                        e.kind,
                        SourceErrorKind::HistoryLost | SourceErrorKind::InvalidToken
                    ) =>
                {
                    warn!(stream = self.def.name, error = %e, "the snapshot's start position cannot be resumed");
                    return Err(self.snapshot_history_lost(progress));
                }
                Err(e) if e.kind == SourceErrorKind::Resumable => self.backoff(&e).await?,
                Err(e) => return Err(StreamExit::Halted(self.fatal(&e))),
            }
        }
    }

    fn snapshot_history_lost(&self, progress: &SnapshotProgress) -> StreamExit {
        self.env
            .status
            .update(|s| s.state = StreamState::HistoryLost);
        StreamExit::Halted(Halt::new(
            HaltReason::HistoryLost,
            format!(
                "stream '{}': the initial snapshot began at {} and has read {} documents, but its recorded start position is no longer in the retained history, so the changes made during the scan cannot all be delivered; nothing was skipped and the stream is halted (whatever on_history_lost says): enlarge the oplog window and restart the snapshot (see the runbook, \"During an initial snapshot\")",
                self.def.name, progress.started_at, progress.scanned
            ),
        ))
    }
}
