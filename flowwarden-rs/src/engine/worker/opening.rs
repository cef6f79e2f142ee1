//! Opening a stream: claim and load its checkpoint, open the source through the resume
//! cascade, and apply `on_history_lost` when every candidate has lost its history.

use tracing::{debug, error, warn};

use super::Worker;
use crate::definition::OnHistoryLost;
use crate::engine::resume::{CandidateKind, ResumePlan};
use crate::engine::StreamExit;
use crate::handler::StreamHandler;
use crate::port::Checkpoint;
use crate::port::StoreErrorKind;
use crate::port::{ChangeCursor, SourceError, SourceErrorKind, StartAt, WatchSpec};
use crate::status::{Halt, HaltReason, StreamState};

/// What `on_history_lost` gave up: from the last checkpoint to where the stream restarts.
pub(super) struct AcceptedGap {
    last: String,
    restart_at: &'static str,
}

impl<H: StreamHandler> Worker<H> {
    pub(super) async fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, StreamExit> {
        self.claim_checkpoint().await?;
        let name = self.def.name;
        loop {
            match self.env.checkpoints.load(&self.env.checkpoint_key).await {
                Ok(c) => return Ok(c),
                Err(e) if e.kind == StoreErrorKind::Corrupt => {
                    return Err(StreamExit::Halted(Halt::new(
                        HaltReason::CorruptCheckpoint,
                        format!(
                            "stream '{name}' cannot start: {}; it was not reset",
                            e.message
                        ),
                    )));
                }
                Err(e) => {
                    let err = SourceError::new(
                        SourceErrorKind::Resumable,
                        format!("checkpoint store unavailable: {}", e.message),
                    );
                    self.backoff(&err).await?;
                }
            }
        }
    }

    /// A leader claims the checkpoint before it reads it: from then on the store rejects the
    /// writes of any older epoch, so what it loads cannot be moved by a deposed leader.
    pub(super) async fn claim_checkpoint(&mut self) -> Result<(), StreamExit> {
        let Some(fence) = self.env.fence.clone() else {
            return Ok(());
        };
        let name = self.def.name;
        loop {
            match self
                .env
                .checkpoints
                .claim(&self.env.checkpoint_key, &fence)
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if e.kind == StoreErrorKind::Fenced => {
                    return Err(StreamExit::Halted(Halt::new(
                        HaltReason::Fenced,
                        format!("stream '{name}': checkpoint claim rejected: {}", e.message),
                    )));
                }
                Err(e) => {
                    let err = SourceError::new(
                        SourceErrorKind::Resumable,
                        format!("checkpoint store unavailable: {}", e.message),
                    );
                    self.backoff(&err).await?;
                }
            }
        }
    }

    /// Opens a cursor, walking the resume cascade and `on_history_lost`.
    pub(super) async fn open(
        &mut self,
        spec: &WatchSpec,
        plan: &mut ResumePlan,
    ) -> Result<Box<dyn ChangeCursor>, StreamExit> {
        let name = self.def.name;
        loop {
            if self.stop_requested() {
                return Err(StreamExit::Stopped);
            }
            let Some(candidate) = plan.candidate().cloned() else {
                let at = self.on_history_lost()?;
                plan.replace(at);
                continue;
            };
            match self.env.source.open(spec, candidate.at.clone()).await {
                Ok(cursor) => {
                    debug!(stream = name, at = %candidate.at, "cursor opened");
                    self.gap_taken();
                    if candidate.kind == CandidateKind::Processed {
                        self.progress.tracker.hold_seen_floor();
                    }
                    if let Some(token) = cursor.initial_position() {
                        self.receive_idle(token);
                        // A cursor opened at "now" or at the oldest entry starts at a
                        // position no checkpoint records yet: write it before reading, so a
                        // crash before the first regular checkpoint cannot restart at "now"
                        // again and skip what was committed meanwhile.
                        self.persist_settled("the stream's start position").await?;
                    }
                    return Ok(cursor);
                }
                Err(e) => match e.kind {
                    SourceErrorKind::HistoryLost | SourceErrorKind::InvalidToken => {
                        self.history_lost_at_candidate(plan, &e);
                    }
                    SourceErrorKind::Resumable => self.backoff(&e).await?,
                    _ => return Err(StreamExit::Halted(self.fatal(&e))),
                },
            }
        }
    }

    pub(super) fn history_lost_at_candidate(&mut self, plan: &mut ResumePlan, e: &SourceError) {
        let from = plan.candidate().map(|c| (c.kind, c.at.to_string()));
        let next = plan.advance().map(|c| c.kind);
        warn!(stream = self.def.name, at = %from.as_ref().map(|f| f.1.as_str()).unwrap_or("?"), error = %e, "cannot resume from this position");
        match (from.map(|f| f.0), next) {
            (Some(CandidateKind::Processed), Some(CandidateKind::Seen)) => {
                self.metrics.fallback_to_seen.increment(1);
                warn!(
                    stream = self.def.name,
                    "falling back to the last seen token"
                );
            }
            (Some(CandidateKind::Seen), Some(CandidateKind::Processed)) => {
                self.metrics.fallback_to_processed.increment(1);
                warn!(
                    stream = self.def.name,
                    "falling back to the last processed token"
                );
            }
            _ => {}
        }
    }

    /// Every candidate lost its history: apply `on_history_lost`.
    pub(super) fn on_history_lost(&mut self) -> Result<StartAt, StreamExit> {
        let name = self.def.name;
        let last = self
            .progress
            .tracker
            .settled_seen()
            .or(self.progress.tracker.settled_processed())
            .map(|p| {
                p.wall_time
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| format!("token {}", p.token))
            })
            .unwrap_or_else(|| "none".into());
        let (at, what) = match self.def.checkpoint.on_history_lost {
            OnHistoryLost::Fail => {
                self.env
                    .status
                    .update(|s| s.state = StreamState::HistoryLost);
                return Err(StreamExit::Halted(Halt::new(
                    HaltReason::HistoryLost,
                    format!(
                        "stream '{name}' cannot resume: its last checkpoint ({last}) is older than the oldest retained history; nothing was skipped and the stream is halted (on_history_lost = Fail)"
                    ),
                )));
            }
            OnHistoryLost::ResumeFromOplogStart => {
                (StartAt::OldestAvailable, "the oldest retained entry")
            }
            OnHistoryLost::ResumeFromNow => (StartAt::Now, "now"),
        };
        self.accepted_gap = Some(AcceptedGap {
            last,
            restart_at: what,
        });
        Ok(at)
    }

    /// The cursor opened where `on_history_lost` chose: the gap it accepted is now real, so it
    /// is counted and logged (not before: an open that fails skips nothing).
    pub(super) fn gap_taken(&mut self) {
        let Some(gap) = self.accepted_gap.take() else {
            return;
        };
        self.metrics.history_lost.increment(1);
        self.env.status.update(|s| s.counters.history_lost += 1);
        error!(stream = self.def.name, last_checkpoint = %gap.last, restart_at = gap.restart_at, runbook = HaltReason::HistoryLost.runbook(), "history lost: changes between the last checkpoint and the restart position are NOT delivered (gap accepted by on_history_lost)");
    }

    pub(super) fn fatal(&self, e: &SourceError) -> Halt {
        let name = self.def.name;
        let reason = match e.kind {
            SourceErrorKind::TooLarge => HaltReason::EventTooLarge,
            SourceErrorKind::Configuration => HaltReason::Configuration,
            SourceErrorKind::OldestUnknown => HaltReason::HistoryLost,
            _ => HaltReason::SourceFatal,
        };
        if e.kind == SourceErrorKind::OldestUnknown {
            return Halt::new(
                reason,
                format!("stream '{name}' cannot resume: its history is lost and on_history_lost = ResumeFromOplogStart, but {}; nothing was skipped and the stream is halted", e.message),
            );
        }
        Halt::new(
            reason,
            format!("stream '{name}': the source cannot continue: {e}"),
        )
    }
}
