//! Writing the tracker's settled prefix to the checkpoint store, stamped with the writer's
//! identity and, for a leader, its fencing epoch.

use std::sync::Arc;

use bson::DateTime;
use tracing::warn;

use super::Worker;
use crate::engine::tracker::Tracker;
use crate::engine::StreamExit;
use crate::handler::StreamHandler;
use crate::port::Fence;
use crate::port::StoreErrorKind;
use crate::port::{Checkpoint, CheckpointStore};
use crate::port::{SourceError, SourceErrorKind};
use crate::status::{Halt, HaltReason, StatusCell};

/// The tracker and the store its checkpoints go to.
pub(super) struct Progress {
    pub(super) tracker: Tracker,
    pub(super) store: Arc<dyn CheckpointStore>,
    pub(super) name: &'static str,
    pub(super) key: String,
    pub(super) fence: Option<Fence>,
    /// The writing instance, stamped on every checkpoint (who wrote it, for operators).
    pub(super) owner: String,
    pub(super) status: Arc<StatusCell>,
    pub(super) saved: metrics::Counter,
    pub(super) failed: metrics::Counter,
}

impl Progress {
    /// Writes the settled prefix if it moved since the last write. A failed write is logged
    /// and retried at the next opportunity; a fenced write halts the stream.
    pub(super) async fn save(&mut self) -> Result<(), Halt> {
        if !self.tracker.is_dirty() {
            return Ok(());
        }
        let checkpoint = self.tracker.snapshot(&self.key, DateTime::now());
        if self.write(checkpoint).await? {
            self.tracker.mark_saved();
        }
        Ok(())
    }

    /// Writes `checkpoint` stamped with the writer's identity and epoch; `Ok(false)` when the
    /// store refused it for a reason other than fencing (logged and counted: the caller keeps
    /// the progress and writes it at the next opportunity); a fenced write halts the stream.
    pub(super) async fn write(&mut self, mut checkpoint: Checkpoint) -> Result<bool, Halt> {
        let name = self.name;
        checkpoint.owner = Some(self.owner.clone());
        if let Some(f) = &self.fence {
            checkpoint.owner = Some(f.owner.clone());
            checkpoint.epoch = Some(f.epoch);
        }
        match self.store.save(&checkpoint).await {
            Ok(()) => {
                self.saved.increment(1);
                // Kept in the status until the next save: not holding the events it came from.
                checkpoint.last_processed = checkpoint.last_processed.map(|p| p.detached());
                checkpoint.last_seen = checkpoint.last_seen.map(|p| p.detached());
                self.status.update(|s| {
                    s.counters.checkpoints_saved += 1;
                    s.checkpoint = Some(checkpoint);
                });
                Ok(true)
            }
            Err(e) if e.kind == StoreErrorKind::Fenced => Err(Halt::new(
                HaltReason::Fenced,
                format!("stream '{name}': checkpoint write rejected: {}", e.message),
            )),
            Err(e) => {
                self.failed.increment(1);
                self.status.update(|s| s.counters.checkpoint_failures += 1);
                warn!(stream = name, error = %e, "checkpoint write failed; progress is kept in memory and written at the next opportunity");
                Ok(false)
            }
        }
    }
}

impl<H: StreamHandler> Worker<H> {
    /// Writes the settled prefix now and does not return before it is stored: a store that
    /// refuses the write is retried with the restart backoff (past `max_attempts` the stream
    /// halts `SourceUnavailable`; a stop request ends the wait). Used where the next step
    /// depends on the write: a start position before the first read, a settled invalidate
    /// before the `Invalidated` halt (so a restart resumes after it and reads the recreated
    /// collection, instead of replaying the invalidate and halting again).
    pub(super) async fn persist_settled(&mut self, what: &str) -> Result<(), StreamExit> {
        while self.progress.tracker.is_dirty() {
            if let Err(h) = self.progress.save().await {
                return Err(StreamExit::Halted(h));
            }
            if self.progress.tracker.is_dirty() {
                let err = SourceError::new(
                    SourceErrorKind::Resumable,
                    format!("checkpoint store unavailable: {what} could not be written"),
                );
                self.backoff(&err).await?;
            }
        }
        Ok(())
    }

    /// Writes `checkpoint` (not the tracker's prefix) and does not return before it is stored,
    /// retrying a refused write with the restart backoff like [`Worker::persist_settled`].
    pub(super) async fn persist_checkpoint(
        &mut self,
        checkpoint: Checkpoint,
        what: &str,
    ) -> Result<(), StreamExit> {
        loop {
            match self.progress.write(checkpoint.clone()).await {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    let err = SourceError::new(
                        SourceErrorKind::Resumable,
                        format!("checkpoint store unavailable: {what} could not be written"),
                    );
                    self.backoff(&err).await?;
                }
                Err(h) => return Err(StreamExit::Halted(h)),
            }
        }
    }
}
