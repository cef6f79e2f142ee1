//! One stream's task: load the checkpoint, open the source through the resume cascade, read
//! and process events, keep the checkpoint on the settled prefix, re-open after errors, and
//! stop or halt loudly.
//!
//! By concept: this module holds the stream loop and its exit; `opening` loads and claims the
//! checkpoint and opens the source (resume cascade, `on_history_lost`); `session` is the
//! per-event select of one open cursor; `snapshot` is the initial snapshot that runs before
//! the first open of a `start_position = Snapshot` stream; `checkpoint_writer` writes the tracker's settled
//! prefix; `backoff` is the restart backoff; `redelivery` remembers what was settled, to count
//! redeliveries.

mod backoff;
mod checkpoint_writer;
mod heartbeat;
mod keyed_session;
mod opening;
mod redelivery;
mod session;
mod snapshot;

use std::sync::Arc;

use tracing::{error, info, warn, Instrument};

use super::metrics::StreamMetrics;
use super::resume::ResumePlan;
use super::rng::{seed_for, Rng};
use super::{StreamEnv, StreamExit};
use crate::definition::StreamDefinition;
use crate::engine::tracker::Tracker;
use crate::handler::StreamHandler;
use crate::port::{SourceError, SourceErrorKind, WatchSpec};
use crate::status::{Halt, HaltReason, StreamState};
use checkpoint_writer::Progress;
use opening::AcceptedGap;
use redelivery::RecentlySettled;

/// Runs one stream until it is stopped or halts.
pub(crate) async fn run_stream<H: StreamHandler>(
    handler: Arc<H>,
    def: &'static StreamDefinition,
    env: StreamEnv,
) -> StreamExit {
    let span = tracing::info_span!("stream", stream = def.name);
    let worker = Worker {
        handler,
        def,
        metrics: StreamMetrics::new(def.name),
        progress: Progress {
            tracker: Tracker::new(None, None),
            store: env.checkpoints.clone(),
            name: def.name,
            key: env.checkpoint_key.clone(),
            fence: env.fence.clone(),
            owner: env.instance.clone(),
            status: env.status.clone(),
            saved: metrics::counter!(crate::engine::metrics::names::CHECKPOINT_SAVED, "stream" => def.name),
            failed: metrics::counter!(crate::engine::metrics::names::CHECKPOINT_FAILED, "stream" => def.name),
            frozen: false,
            #[cfg(feature = "test-util")]
            never_freeze: env.options.no_freeze_after_unknown_outcome,
            in_flight: None,
        },
        rng: Rng::new(seed_for(env.options.seed, def.name)),
        restart_failures: 0,
        recent: RecentlySettled::new(4096),
        accepted_gap: None,
        next_publish: tokio::time::Instant::now(),
        reading: None,
        env,
    };
    worker.run().instrument(span).await
}

/// How a read session ended.
enum SessionEnd {
    Stop,
    Halt(Halt),
    Invalidated,
    Source(SourceError),
}

struct Worker<H: StreamHandler> {
    handler: Arc<H>,
    def: &'static StreamDefinition,
    env: StreamEnv,
    metrics: StreamMetrics,
    progress: Progress,
    rng: Rng,
    restart_failures: u32,
    recent: RecentlySettled,
    /// A gap `on_history_lost` accepted, counted once the cursor opens there.
    accepted_gap: Option<AcceptedGap>,
    /// When the settled position may next be published for the lag sampler.
    next_publish: tokio::time::Instant,
    /// The clock reading taken when the latest event settled (the end of its handler, when one
    /// ran): the serial session's heartbeat check before the next event reuses it instead of
    /// reading the clock again. Taken (and dropped) by the loop's next turn whatever it does.
    reading: Option<tokio::time::Instant>,
}

impl<H: StreamHandler> Worker<H> {
    fn spec(&self) -> WatchSpec {
        WatchSpec {
            stream: self.def.name,
            database: Some(
                self.def
                    .database
                    .map(str::to_owned)
                    .unwrap_or_else(|| self.env.options.default_database.clone()),
            ),
            collection: self.def.collection.to_owned(),
            pipeline: H::pipeline(),
            full_document: self.def.full_document,
            full_document_before_change: self.def.full_document_before_change,
            batch_size: self.env.options.batch_size,
            max_await: self.env.options.max_await,
        }
    }

    fn stop_requested(&self) -> bool {
        *self.env.stop.borrow()
    }

    async fn run(mut self) -> StreamExit {
        let name = self.def.name;
        self.env.status.set_state(StreamState::Starting);
        let stored = match self.load_checkpoint().await {
            Ok(stored) => stored,
            Err(exit) => return self.exit(exit).await,
        };
        let stored = match self.initial_snapshot(stored).await {
            Ok(stored) => stored,
            Err(exit) => return self.exit(exit).await,
        };
        let tracker = Tracker::new(
            stored.as_ref().and_then(|c| c.last_seen.clone()),
            stored.as_ref().and_then(|c| c.last_processed.clone()),
        );
        #[cfg(feature = "test-util")]
        let tracker = tracker
            .with_checkpoint_on_receipt(self.env.options.checkpoint_on_receipt)
            .with_checkpoint_highest_completed(self.env.options.checkpoint_highest_completed);
        self.progress.tracker = tracker;
        let mut plan = ResumePlan::initial(self.def, stored.as_ref());
        let spec = self.spec();
        info!(stream = name, source = %self.env.source.describe(), start = %plan.candidate().map(|c| c.at.to_string()).unwrap_or_default(), "stream starting");

        loop {
            if self.stop_requested() {
                return self.exit(StreamExit::Stopped).await;
            }
            // Taken before the open: a cursor opened at "now" or at the oldest entry moves the
            // settled position to where it starts, and a later re-open must resume from there
            // (not open at "now" again, which would skip what was committed meanwhile).
            let before = self.progress.tracker.settled_seen().cloned();
            let cursor = match self.open(&spec, &mut plan).await {
                Ok(cursor) => cursor,
                Err(exit) => return self.exit(exit).await,
            };
            self.env.status.set_state(StreamState::Running);
            self.env.probe.set_caught_up(false);
            self.publish_position(true, tokio::time::Instant::now());
            let end = self.session(cursor).await;
            self.progress.tracker.abandon_unsettled();
            if let Some(now) = self.progress.tracker.settled_seen() {
                if before.as_ref() != Some(now) {
                    plan = ResumePlan::current(now);
                }
            }
            match end {
                SessionEnd::Stop => return self.exit(StreamExit::Stopped).await,
                SessionEnd::Halt(h) => return self.exit(StreamExit::Halted(h)).await,
                SessionEnd::Invalidated => {
                    let h = Halt::new(
                        HaltReason::Invalidated,
                        format!(
                            "stream '{name}': the watched collection {} was dropped or renamed (invalidate); the stream stopped after handling the invalidate",
                            self.collection_label()
                        ),
                    );
                    return self.exit(StreamExit::Halted(h)).await;
                }
                SessionEnd::Source(e) => match e.kind {
                    SourceErrorKind::Resumable => {
                        if let Err(exit) = self.backoff(&e).await {
                            return self.exit(exit).await;
                        }
                    }
                    SourceErrorKind::HistoryLost | SourceErrorKind::InvalidToken => {
                        self.history_lost_at_candidate(&mut plan, &e);
                    }
                    _ => {
                        let h = self.fatal(&e);
                        return self.exit(StreamExit::Halted(h)).await;
                    }
                },
            }
        }
    }

    fn collection_label(&self) -> String {
        format!(
            "{}.{}",
            self.def
                .database
                .unwrap_or(self.env.options.default_database.as_str()),
            self.def.collection
        )
    }

    /// Flushes the settled progress and reports the exit.
    async fn exit(mut self, exit: StreamExit) -> StreamExit {
        let name = self.def.name;
        self.progress.tracker.abandon_unsettled();
        if let Err(h) = self.progress.settle_in_flight().await {
            warn!(stream = name, "checkpoint write failed: {h}");
        }
        if self.progress.tracker.is_dirty() {
            if let Err(h) = self.progress.save().await {
                warn!(stream = name, "final checkpoint flush failed: {h}");
            }
        }
        match &exit {
            StreamExit::Stopped => {
                info!(stream = name, "stream stopped");
                self.env.status.set_state(StreamState::Stopped);
            }
            StreamExit::Halted(h) => {
                error!(
                    stream = name,
                    runbook = h.runbook,
                    "stream halted: {}",
                    h.message
                );
                let state = if h.reason == HaltReason::HistoryLost {
                    StreamState::HistoryLost
                } else {
                    StreamState::Stopped
                };
                let h = h.clone();
                self.env.status.update(|s| {
                    s.state = state;
                    s.halt = Some(h);
                });
            }
        }
        exit
    }
}
