//! One stream's task: load the checkpoint, open the source through the resume cascade, read
//! and process events, keep the checkpoint on the settled prefix, re-open after errors, and
//! stop or halt loudly.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::{debug, error, info, warn, Instrument};

use super::metrics::StreamMetrics;
use super::process::{process_event, EventOutcome, ProcessCx};
use super::reader::{read_loop, ReadResult};
use super::resume::{CandidateKind, ResumePlan};
use super::rng::{seed_for, Rng};
use super::{StreamEnv, StreamExit};
use crate::checkpoint::{Checkpoint, CheckpointStore, Settlement, StoredPosition, Tracker};
use crate::definition::{OnHistoryLost, StreamDefinition};
use crate::event::{ChangeEvent, OperationType, ResumeToken};
use crate::handler::StreamHandler;
use crate::lease::Fence;
use crate::source::{ChangeCursor, SourceError, SourceErrorKind, SourceItem, StartAt, WatchSpec};
use crate::status::{Halt, HaltReason, StatusCell, StreamState};
use crate::store_error::StoreErrorKind;

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
            tracker: Tracker::new(None, None, env.options.checkpoint_on_receipt),
            store: env.checkpoints.clone(),
            name: def.name,
            key: env.checkpoint_key.clone(),
            fence: env.fence.clone(),
            owner: env.instance.clone(),
            status: env.status.clone(),
            saved: metrics::counter!(super::metrics::names::CHECKPOINT_SAVED, "stream" => def.name),
            failed: metrics::counter!(super::metrics::names::CHECKPOINT_FAILED, "stream" => def.name),
        },
        rng: Rng::new(seed_for(env.options.seed, def.name)),
        restart_failures: 0,
        recent: RecentlySettled::new(4096),
        accepted_gap: None,
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

/// A bounded memory of tokens settled in this process, to count redeliveries. Keeps hashes of
/// the tokens' data, not the tokens: a collision can only miscount a redelivery, never change
/// what is processed.
struct RecentlySettled {
    set: HashSet<u64>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl RecentlySettled {
    fn new(capacity: usize) -> Self {
        Self {
            set: HashSet::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    fn key(token: &ResumeToken) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let data = token.data()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        data.hash(&mut h);
        Some(h.finish())
    }

    fn contains(&self, token: &ResumeToken) -> bool {
        Self::key(token).is_some_and(|k| self.set.contains(&k))
    }

    fn insert(&mut self, token: &ResumeToken) {
        let Some(key) = Self::key(token) else { return };
        if !self.set.insert(key) {
            return;
        }
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(key);
    }
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
}

/// What `on_history_lost` gave up: from the last checkpoint to where the stream restarts.
struct AcceptedGap {
    last: String,
    restart_at: &'static str,
}

fn halt(reason: HaltReason, message: String) -> Halt {
    Halt {
        reason,
        message,
        runbook: reason.runbook(),
    }
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
        self.progress.tracker = Tracker::new(
            stored.as_ref().and_then(|c| c.last_seen.clone()),
            stored.as_ref().and_then(|c| c.last_processed.clone()),
            self.env.options.checkpoint_on_receipt,
        );
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
                    let h = halt(
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

    async fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, StreamExit> {
        self.claim_checkpoint().await?;
        let name = self.def.name;
        loop {
            match self.env.checkpoints.load(&self.env.checkpoint_key).await {
                Ok(c) => return Ok(c),
                Err(e) if e.kind == StoreErrorKind::Corrupt => {
                    return Err(StreamExit::Halted(halt(
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
    async fn claim_checkpoint(&mut self) -> Result<(), StreamExit> {
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
                    return Err(StreamExit::Halted(halt(
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
    async fn open(
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
                        self.persist_start_position().await?;
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

    /// A cursor opened at "now" or at the oldest entry starts at a position no checkpoint
    /// records yet: write it before reading, so a crash before the first regular checkpoint
    /// cannot restart at "now" again and skip what was committed meanwhile. A store that
    /// refuses the write is retried with the restart backoff.
    async fn persist_start_position(&mut self) -> Result<(), StreamExit> {
        while self.progress.tracker.is_dirty() {
            if let Err(h) = self.progress.save().await {
                return Err(StreamExit::Halted(h));
            }
            if self.progress.tracker.is_dirty() {
                let err = SourceError::new(
                    SourceErrorKind::Resumable,
                    "checkpoint store unavailable: the stream's start position could not be written",
                );
                self.backoff(&err).await?;
            }
        }
        Ok(())
    }

    fn history_lost_at_candidate(&mut self, plan: &mut ResumePlan, e: &SourceError) {
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
    fn on_history_lost(&mut self) -> Result<StartAt, StreamExit> {
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
                return Err(StreamExit::Halted(halt(
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
    fn gap_taken(&mut self) {
        let Some(gap) = self.accepted_gap.take() else {
            return;
        };
        self.metrics.history_lost.increment(1);
        self.env.status.update(|s| s.counters.history_lost += 1);
        error!(stream = self.def.name, last_checkpoint = %gap.last, restart_at = gap.restart_at, runbook = HaltReason::HistoryLost.runbook(), "history lost: changes between the last checkpoint and the restart position are NOT delivered (gap accepted by on_history_lost)");
    }

    fn fatal(&self, e: &SourceError) -> Halt {
        let name = self.def.name;
        let reason = match e.kind {
            SourceErrorKind::TooLarge => HaltReason::EventTooLarge,
            SourceErrorKind::Configuration => HaltReason::Configuration,
            SourceErrorKind::OldestUnknown => HaltReason::HistoryLost,
            _ => HaltReason::SourceFatal,
        };
        if e.kind == SourceErrorKind::OldestUnknown {
            return halt(
                reason,
                format!("stream '{name}' cannot resume: its history is lost and on_history_lost = ResumeFromOplogStart, but {}; nothing was skipped and the stream is halted", e.message),
            );
        }
        halt(
            reason,
            format!("stream '{name}': the source cannot continue: {e}"),
        )
    }

    /// Waits out the restart backoff after a source failure; fails past `max_attempts`.
    async fn backoff(&mut self, e: &SourceError) -> Result<(), StreamExit> {
        let name = self.def.name;
        self.restart_failures += 1;
        let attempt = self.restart_failures;
        let max = self.def.restart.max_attempts;
        if max > 0 && attempt > max {
            return Err(StreamExit::Halted(halt(
                HaltReason::SourceUnavailable,
                format!(
                    "stream '{name}': the source failed {attempt} times in a row (restart max_attempts = {max}); last error: {e}"
                ),
            )));
        }
        let delay = self.def.restart.delay(attempt);
        self.metrics.restarts.increment(1);
        self.env.status.update(|s| {
            s.state = StreamState::Resuming;
            s.counters.restarts += 1;
        });
        warn!(stream = name, attempt, delay_ms = delay.as_millis() as u64, error = %e, runbook = HaltReason::SourceUnavailable.runbook(), "source error; re-opening from the settled position after a delay");
        let mut stop = self.env.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => Ok(()),
            _ = stopped(&mut stop) => Err(StreamExit::Stopped),
        }
    }

    fn receive_idle(&mut self, token: ResumeToken) {
        if self.progress.tracker.unsettled() == 0
            && self.progress.tracker.settled_seen().map(|p| &p.token) == Some(&token)
        {
            return;
        }
        self.progress.tracker.receive_idle(StoredPosition {
            token,
            cluster_time: None,
            wall_time: None,
            start_after: false,
        });
    }

    async fn session(&mut self, cursor: Box<dyn ChangeCursor>) -> SessionEnd {
        let capacity = self.env.options.batch_size.clamp(1, 4096) as usize;
        let (tx, mut rx) = mpsc::channel::<ReadResult>(capacity);
        let reader = AbortOnDrop(tokio::spawn(read_loop(cursor, tx)));
        let mut heartbeat = heartbeat(self.def);
        let mut stop = self.env.stop.clone();
        loop {
            let msg = tokio::select! {
                biased;
                _ = stopped(&mut stop) => return SessionEnd::Stop,
                _ = tick(&mut heartbeat) => {
                    if let Err(h) = self.progress.save().await {
                        return SessionEnd::Halt(h);
                    }
                    continue;
                }
                msg = rx.recv() => msg,
            };
            match msg {
                None => {
                    return SessionEnd::Source(SourceError::new(
                        SourceErrorKind::Resumable,
                        "the reader task ended unexpectedly",
                    ))
                }
                Some(Err(e)) => return SessionEnd::Source(e),
                Some(Ok(None)) => {
                    return SessionEnd::Source(SourceError::new(
                        SourceErrorKind::Resumable,
                        "the source closed the cursor",
                    ))
                }
                Some(Ok(Some(SourceItem::Idle(token)))) => {
                    self.restart_failures = 0;
                    if let Some(token) = token {
                        self.receive_idle(token);
                    }
                }
                Some(Ok(Some(SourceItem::Event(raw)))) => {
                    self.restart_failures = 0;
                    if let Some(end) = self.on_event(raw, &mut heartbeat).await {
                        drop(reader);
                        return end;
                    }
                }
            }
        }
    }

    /// Handles one raw event; returns how the session ends, if it does.
    async fn on_event(
        &mut self,
        raw: bson::Document,
        heartbeat: &mut Option<Interval>,
    ) -> Option<SessionEnd> {
        let name = self.def.name;
        let event = match ChangeEvent::from_raw(raw) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                return Some(SessionEnd::Halt(halt(
                    HaltReason::SourceFatal,
                    format!("stream '{name}': the source delivered an event that cannot be identified ({e}); it cannot be checkpointed past, so the stream halts"),
                )))
            }
        };
        self.metrics.received.increment(1);
        if let Some(wall) = event.wall_time() {
            let lag_ms = DateTime::now().timestamp_millis() - wall.timestamp_millis();
            self.metrics.lag.set(lag_ms as f64 / 1000.0);
        }
        let redelivered = self.recent.contains(event.token());
        if redelivered {
            self.metrics.redelivered.increment(1);
            debug!(stream = name, token = %event.token(), "event delivered again after it was settled; processing it again (at-least-once)");
        }
        self.env.status.update(|s| {
            s.counters.received += 1;
            if redelivered {
                s.counters.redelivered += 1;
            }
            if event.wall_time().is_some() {
                s.last_event_at = event.wall_time();
            }
        });
        let invalidate = *event.operation_type() == OperationType::Invalidate;
        let ticket = self.progress.tracker.receive(StoredPosition {
            token: event.token().clone(),
            cluster_time: event.cluster_time(),
            wall_time: event.wall_time(),
            start_after: invalidate,
        });

        let cx = ProcessCx {
            def: self.def,
            dead_letters: self.env.dead_letters.as_ref(),
            options: &self.env.options,
            metrics: &self.metrics,
            status: &self.env.status,
            fence: self.env.fence.as_ref(),
        };
        let span = tracing::info_span!(
            "event",
            token = %event.token(),
            operation = %event.operation_type(),
        );
        let fut = process_event(&self.handler, event.clone(), &cx, &mut self.rng).instrument(span);
        tokio::pin!(fut);
        let mut stop = self.env.stop.clone();
        let mut deadline: Option<Instant> = None;
        let outcome = loop {
            tokio::select! {
                biased;
                outcome = &mut fut => break Some(outcome),
                _ = tick(heartbeat) => {
                    if let Err(h) = self.progress.save().await {
                        break Some(EventOutcome::Halt(h));
                    }
                }
                _ = stopped(&mut stop), if deadline.is_none() => {
                    let timeout = self.env.options.shutdown_timeout;
                    info!(stream = name, timeout_ms = timeout.as_millis() as u64, "stop requested; waiting for the in-flight handler");
                    deadline = Some(Instant::now() + timeout);
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    warn!(stream = name, token = %event.token(), "the in-flight handler did not finish within the shutdown timeout; the event stays unsettled and will be delivered again");
                    break None;
                }
            }
        };
        let outcome = match outcome {
            None => return Some(SessionEnd::Stop),
            Some(o) => o,
        };
        match outcome {
            EventOutcome::Halt(h) => Some(SessionEnd::Halt(h)),
            EventOutcome::Settled { how, save_now } => {
                self.progress.tracker.settle(ticket, how);
                if how != Settlement::Filtered && how != Settlement::Unrouted {
                    self.recent.insert(event.token());
                }
                let due = save_now
                    || self.progress.tracker.processed_since_save()
                        >= self.def.checkpoint.save_every_n
                    || invalidate;
                if due {
                    if let Err(h) = self.progress.save().await {
                        return Some(SessionEnd::Halt(h));
                    }
                }
                if invalidate {
                    return Some(SessionEnd::Invalidated);
                }
                if deadline.is_some() {
                    return Some(SessionEnd::Stop);
                }
                None
            }
        }
    }

    /// Flushes the settled progress and reports the exit.
    async fn exit(mut self, exit: StreamExit) -> StreamExit {
        let name = self.def.name;
        self.progress.tracker.abandon_unsettled();
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

/// The tracker and the store its checkpoints go to.
struct Progress {
    tracker: Tracker,
    store: Arc<dyn CheckpointStore>,
    name: &'static str,
    key: String,
    fence: Option<Fence>,
    /// The writing instance, stamped on every checkpoint (who wrote it, for operators).
    owner: String,
    status: Arc<StatusCell>,
    saved: metrics::Counter,
    failed: metrics::Counter,
}

impl Progress {
    /// Writes the settled prefix if it moved since the last write. A failed write is logged
    /// and retried at the next opportunity; a fenced write halts the stream.
    async fn save(&mut self) -> Result<(), Halt> {
        if !self.tracker.is_dirty() {
            return Ok(());
        }
        let name = self.name;
        let mut snapshot = self.tracker.snapshot(&self.key, DateTime::now());
        snapshot.owner = Some(self.owner.clone());
        if let Some(f) = &self.fence {
            snapshot.owner = Some(f.owner.clone());
            snapshot.epoch = Some(f.epoch);
        }
        match self.store.save(&snapshot).await {
            Ok(()) => {
                self.tracker.mark_saved();
                self.saved.increment(1);
                self.status.update(|s| s.counters.checkpoints_saved += 1);
                Ok(())
            }
            Err(e) if e.kind == StoreErrorKind::Fenced => Err(halt(
                HaltReason::Fenced,
                format!("stream '{name}': checkpoint write rejected: {}", e.message),
            )),
            Err(e) => {
                self.failed.increment(1);
                self.status.update(|s| s.counters.checkpoint_failures += 1);
                warn!(stream = name, error = %e, "checkpoint write failed; progress is kept in memory and written at the next opportunity");
                Ok(())
            }
        }
    }
}

fn heartbeat(def: &StreamDefinition) -> Option<Interval> {
    let secs = def.checkpoint.save_interval_secs;
    if secs == 0 {
        return None;
    }
    let period = Duration::from_secs(secs);
    let mut iv = tokio::time::interval_at(Instant::now() + period, period);
    iv.set_missed_tick_behavior(MissedTickBehavior::Delay);
    Some(iv)
}

async fn tick(iv: &mut Option<Interval>) {
    match iv {
        Some(iv) => {
            iv.tick().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// Resolves once a stop is requested (or the runtime that could request it is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending::<()>().await,
    }
}

/// Aborts the reader task when the session ends, whatever the path.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
