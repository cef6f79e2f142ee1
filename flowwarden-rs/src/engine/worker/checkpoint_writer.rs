//! Writing the tracker's settled prefix to the checkpoint store, stamped with the writer's
//! identity and, for a leader, its fencing epoch.

use std::sync::Arc;

use bson::DateTime;
use tracing::{debug, warn};

use super::Worker;
use crate::engine::tracker::{Settlement, Ticket, Tracker};
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
    /// Set when a transaction of this stream may have committed without the runtime knowing
    /// (its commit's outcome is unknown, or it was abandoned mid-attempt by a stop): the
    /// stored checkpoint may then be ahead of the tracker, and no plain write may put it back.
    pub(super) frozen: bool,
    /// Test-only: [`Progress::freeze`] does nothing (`Builder::no_freeze_after_unknown_outcome`).
    #[cfg(feature = "test-util")]
    pub(super) never_freeze: bool,
}

impl Progress {
    /// Writes the settled prefix if it moved since the last write. A failed write is logged
    /// and retried at the next opportunity; a fenced write halts the stream.
    pub(super) async fn save(&mut self) -> Result<(), Halt> {
        if !self.tracker.is_dirty() || self.frozen {
            return Ok(());
        }
        let checkpoint = self.tracker.snapshot(&self.key, DateTime::now());
        if self.write(checkpoint).await? {
            self.tracker.mark_saved();
        }
        Ok(())
    }

    /// Stamps `checkpoint` with the writer's identity and, for a leader, its epoch.
    pub(super) fn stamp(&self, checkpoint: &mut Checkpoint) {
        checkpoint.owner = Some(self.owner.clone());
        if let Some(f) = &self.fence {
            checkpoint.owner = Some(f.owner.clone());
            checkpoint.epoch = Some(f.epoch);
        }
    }

    /// The checkpoint as it will stand once the event of `ticket` is settled as handled (the
    /// one a transactional event commits with its writes), stamped.
    pub(super) fn preview_handled(&self, ticket: Ticket) -> Checkpoint {
        let mut after = self.tracker.clone();
        after.settle(ticket, Settlement::Handled);
        let mut checkpoint = after.snapshot(&self.key, DateTime::now());
        self.stamp(&mut checkpoint);
        checkpoint
    }

    /// Stops every further plain checkpoint write of this run (see [`Progress::frozen`]).
    pub(super) fn freeze(&mut self) {
        #[cfg(feature = "test-util")]
        if self.never_freeze {
            return;
        }
        if !self.frozen {
            warn!(stream = self.name, "a transaction's outcome is unknown to this run: no further checkpoint is written until the stream restarts from the stored one");
        }
        self.frozen = true;
    }

    /// Records a checkpoint stored by a transaction's commit: the tracker's settled prefix
    /// (already settled by the caller) is what it holds.
    pub(super) fn committed(&mut self, checkpoint: Checkpoint) {
        self.tracker.mark_saved();
        self.recorded(checkpoint);
    }

    fn recorded(&self, mut checkpoint: Checkpoint) {
        self.saved.increment(1);
        // Kept in the status until the next save: not holding the events it came from.
        checkpoint.last_processed = checkpoint.last_processed.map(|p| p.detached());
        checkpoint.last_seen = checkpoint.last_seen.map(|p| p.detached());
        self.status.update(|s| {
            s.counters.checkpoints_saved += 1;
            s.checkpoint = Some(checkpoint);
        });
    }

    /// Writes `checkpoint` stamped with the writer's identity and epoch; `Ok(false)` when the
    /// store refused it for a reason other than fencing (logged and counted: the caller keeps
    /// the progress and writes it at the next opportunity); a fenced write halts the stream.
    pub(super) async fn write(&mut self, mut checkpoint: Checkpoint) -> Result<bool, Halt> {
        let name = self.name;
        if self.frozen {
            debug!(stream = name, "checkpoint not written: a transaction's outcome is unknown, the stored checkpoint decides on restart");
            return Ok(true);
        }
        self.stamp(&mut checkpoint);
        match self.store.save(&checkpoint).await {
            Ok(()) => {
                self.recorded(checkpoint);
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
        while self.progress.tracker.is_dirty() && !self.progress.frozen {
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
