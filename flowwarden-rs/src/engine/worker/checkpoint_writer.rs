//! Writing the tracker's settled prefix to the checkpoint store, stamped with the writer's
//! identity and, for a leader, its fencing epoch.
//!
//! The saves a busy stream makes as it goes (every `save_every_n` events) are written behind
//! it ([`Progress::save_behind`]): the write of the settled prefix as it stands starts, and the
//! stream goes on handling events while the store answers. At most one write is in flight;
//! a save that falls due meanwhile waits for it and then writes the prefix as it stands then
//! (so a store slower than the stream gets fewer, larger steps, never two racing writes). Every
//! other write (the heartbeat's, a stop's, a start position, the settled invalidate) first
//! waits for the one in flight, so the stored checkpoint only moves forward. What the write
//! carries is still only the settled prefix: behind the stream means later, never further.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bson::DateTime;
use futures::FutureExt;
use tracing::{debug, warn};

use super::Worker;
use crate::engine::tracker::{Settlement, Ticket, Tracker};
use crate::engine::{AbortOnDrop, StreamExit};
use crate::handler::StreamHandler;
use crate::port::Fence;
use crate::port::{Checkpoint, CheckpointStore};
use crate::port::{SourceError, SourceErrorKind};
use crate::port::{StoreError, StoreErrorKind};
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
    /// The write running behind the stream, if any (see the module documentation).
    pub(super) in_flight: Option<InFlight>,
}

/// A checkpoint write running behind the stream, on a task of its own (aborted if the stream's
/// task ends without waiting for it: a crash).
pub(super) struct InFlight {
    task: AbortOnDrop<Written>,
    /// The events processed since the previous save that this write covers: they count
    /// towards the next save again if it fails.
    processed: u32,
}

/// What the store answered to a write, with the checkpoint written.
pub(super) struct Written {
    result: Result<(), StoreError>,
    checkpoint: Checkpoint,
}

/// A finished write behind the stream, as [`in_flight_finished`] hands it over.
pub(super) struct Finished {
    written: Result<Written, tokio::task::JoinError>,
    processed: u32,
}

/// Waits until the write in `slot` finishes and takes it out; pending for ever when there is
/// none. Cancel-safe: the write is taken only in the poll that returns it.
pub(super) async fn in_flight_finished(slot: &mut Option<InFlight>) -> Finished {
    let Some(in_flight) = slot.as_mut() else {
        return std::future::pending().await;
    };
    let written = (&mut in_flight.task.0).await;
    let processed = in_flight.processed;
    *slot = None;
    Finished { written, processed }
}

impl Progress {
    /// Writes the settled prefix if it moved since the last write, after the write in flight
    /// (if any), and returns once the store answered. A failed write is logged and retried at
    /// the next opportunity; a fenced write halts the stream.
    ///
    /// Boxed: a session awaits it beside every event's processing (the heartbeat's branch), and
    /// held in place the write's state would make each event's future that much larger, all of
    /// it copied for every event.
    pub(super) fn save(&mut self) -> Pin<Box<dyn Future<Output = Result<(), Halt>> + Send + '_>> {
        Box::pin(self.save_in_line())
    }

    async fn save_in_line(&mut self) -> Result<(), Halt> {
        self.settle_in_flight().await?;
        if !self.tracker.is_dirty() || self.frozen {
            return Ok(());
        }
        let checkpoint = self.tracker.snapshot(&self.key, DateTime::now());
        if self.write(checkpoint).await? {
            self.tracker.mark_saved();
        }
        Ok(())
    }

    /// Starts writing the settled prefix behind the stream if it moved since the last write and
    /// no write is in flight; returns at once. A store that answers without waiting (the
    /// in-memory backend) is written inline; otherwise the write goes on on a task of its own.
    /// A write that finished since the last look is taken into account first: a fenced one
    /// halts the stream here.
    pub(super) fn save_behind(&mut self) -> Result<(), Halt> {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|w| w.task.0.is_finished())
        {
            // Finished: the join handle answers in one poll.
            if let Some(finished) = in_flight_finished(&mut self.in_flight).now_or_never() {
                self.finish(finished)?;
            }
        }
        if self.in_flight.is_some() || self.frozen || !self.tracker.is_dirty() {
            return Ok(());
        }
        let mut checkpoint = self.tracker.snapshot(&self.key, DateTime::now());
        self.stamp(&mut checkpoint);
        let processed = self.tracker.processed_since_save();
        self.tracker.mark_saved();
        let store = self.store.clone();
        let mut write: Pin<Box<dyn Future<Output = Written> + Send>> = Box::pin(async move {
            let result = store.save(&checkpoint).await;
            Written { result, checkpoint }
        });
        // Polled once here with a waker that does nothing: the task that takes the write over
        // polls it again with its own, and a future wakes only the waker of its latest poll.
        match write.as_mut().now_or_never() {
            Some(written) => self.finish(Finished {
                written: Ok(written),
                processed,
            }),
            None => {
                self.in_flight = Some(InFlight {
                    task: AbortOnDrop(tokio::spawn(write)),
                    processed,
                });
                Ok(())
            }
        }
    }

    /// Waits for the write in flight, if any, and takes its answer into account.
    pub(super) async fn settle_in_flight(&mut self) -> Result<(), Halt> {
        if self.in_flight.is_none() {
            return Ok(());
        }
        let finished = in_flight_finished(&mut self.in_flight).await;
        self.finish(finished)
    }

    /// Takes a finished write behind the stream into account: recorded when stored; when
    /// refused, logged, counted, and its events count towards the next save again; a fenced
    /// write halts the stream.
    pub(super) fn finish(&mut self, finished: Finished) -> Result<(), Halt> {
        let stored = match finished.written {
            Ok(Written { result, checkpoint }) => self.answered(result.map(|()| checkpoint))?,
            // The write's task panicked (a store bug) or was cancelled: not stored.
            Err(e) => self.answered(Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("the checkpoint write did not complete ({e})"),
            )))?,
        };
        if !stored {
            self.tracker.mark_unsaved(finished.processed);
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
        self.settle_in_flight().await?;
        if self.frozen {
            debug!(stream = self.name, "checkpoint not written: a transaction's outcome is unknown, the stored checkpoint decides on restart");
            return Ok(true);
        }
        self.stamp(&mut checkpoint);
        let result = self.store.save(&checkpoint).await;
        self.answered(result.map(|()| checkpoint))
    }

    /// What the store's answer to a write means: `Ok(true)` stored (the checkpoint written is
    /// recorded in the status), `Ok(false)` refused for a reason other than fencing (logged and
    /// counted), a halt when fenced.
    fn answered(&mut self, result: Result<Checkpoint, StoreError>) -> Result<bool, Halt> {
        let name = self.name;
        match result {
            Ok(checkpoint) => {
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
