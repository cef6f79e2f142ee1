//! One read session: each event is received by the tracker, processed (filter, route, retry,
//! dead-letter) and settled, while the heartbeat and a stop request are served in the same
//! select (or, between two events at hand, checked without one). A cursor that waits on a
//! server is read by a reader feeding a bounded channel; a serial stream over a cursor that
//! answers from memory reads it itself, one event at a time.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn, Instrument};

use super::backoff::{stop_requested, stopped};
use super::checkpoint_writer::in_flight_finished;
use super::heartbeat::Heartbeat;
use super::redelivery::RecentKey;
use super::{SessionEnd, Worker};
use crate::definition::StreamDefinition;
use crate::engine::alongside::alongside;
use crate::engine::lag::PUBLISH_EVERY;
use crate::engine::process::{process_event, EventOutcome, ProcessCx};
use crate::engine::reader::{hand_over, max_batch, read_loop, Inbox, ReadResult};
use crate::engine::tracker::{Settlement, Ticket};
use crate::engine::transaction::TxnCx;
use crate::engine::{AbortOnDrop, StreamExit};
use crate::event::{ChangeEvent, OperationType, ResumeToken};
use crate::handler::StreamHandler;
use crate::port::{ChangeCursor, ReadMode, SourceError, SourceErrorKind, SourceItem};
use crate::port::{Checkpoint, StoredPosition};
use crate::status::{Halt, HaltReason};

impl<H: StreamHandler> Worker<H> {
    pub(super) fn receive_idle(&mut self, token: ResumeToken) {
        let tracker = &mut self.progress.tracker;
        if tracker.unsettled() > 0 || tracker.settled_seen().map(|p| &p.token) != Some(&token) {
            tracker.receive_idle(StoredPosition {
                token,
                cluster_time: None,
                wall_time: None,
                start_after: false,
            });
        }
        // An empty batch after everything received settled: nothing is behind.
        self.env
            .probe
            .set_caught_up(self.progress.tracker.unsettled() == 0);
        self.publish_position(true, Instant::now());
    }

    /// Tells the lag sampler the settled position: at once when `force`, otherwise at most
    /// every [`PUBLISH_EVERY`], so a busy stream pays for it rarely. `at` is a clock reading
    /// taken just before.
    pub(super) fn publish_position(&mut self, force: bool, at: Instant) {
        if !force && at < self.next_publish {
            return;
        }
        self.next_publish = at + PUBLISH_EVERY;
        if let Some(p) = self.progress.tracker.settled_seen() {
            self.env.probe.publish(&p.token);
        }
    }

    pub(super) async fn session(&mut self, mut cursor: Box<dyn ChangeCursor>) -> SessionEnd {
        let mode = cursor.read_mode();
        let mut heartbeat = heartbeat(self.def);
        let keyed = self.def.concurrency.concurrency() > 1;
        if mode == ReadMode::InProcess && !keyed {
            // Nothing to overlap, nothing to hand over: the stream's task reads each event as
            // it takes it.
            let end = self.serial_in_process(&mut cursor, &mut heartbeat).await;
            drop(cursor);
            return self.session_ended(end).await;
        }
        // Batches of up to `batch_size` items (fewer for a cursor read in process), one in the
        // channel: the reader reads ahead at most three batches (the one being taken apart, the
        // one in the channel, the one being filled) and the stream task takes a batch at a time.
        let (outbox, mut rx) = hand_over(1, max_batch(mode, self.env.options.batch_size));
        let reader = read_loop(cursor, outbox);
        let process = async {
            if keyed {
                self.keyed_session(&mut rx, &mut heartbeat).await
            } else {
                self.serial_session(&mut rx, &mut heartbeat).await
            }
        };
        let end = match mode {
            ReadMode::InProcess => alongside(process, reader).await,
            _ => {
                let reader = AbortOnDrop(tokio::spawn(reader));
                let end = process.await;
                drop(reader);
                end
            }
        };
        self.session_ended(end).await
    }

    /// What follows every session, however it read: the write behind the stream is answered,
    /// and a settled invalidate is stored before the session reports it.
    async fn session_ended(&mut self, end: SessionEnd) -> SessionEnd {
        // The write behind the stream is answered before anything else happens: a fenced one
        // halts the stream whatever ended the session.
        let end = match self.progress.settle_in_flight().await {
            Err(h) if !matches!(end, SessionEnd::Halt(_)) => SessionEnd::Halt(h),
            _ => end,
        };
        if matches!(end, SessionEnd::Invalidated) {
            // Halt only once the invalidate is stored: a restart then resumes after it and
            // reads the recreated collection.
            return match self.persist_settled("the settled invalidate").await {
                Ok(()) => SessionEnd::Invalidated,
                Err(StreamExit::Stopped) => SessionEnd::Stop,
                Err(StreamExit::Halted(h)) => SessionEnd::Halt(h),
            };
        }
        end
    }

    /// `concurrency = 1`: one event at a time, in stream order.
    async fn serial_session(
        &mut self,
        rx: &mut Inbox,
        heartbeat: &mut Option<Heartbeat>,
    ) -> SessionEnd {
        let mut stop = self.env.stop.clone();
        if *stop.borrow_and_update() {
            return SessionEnd::Stop;
        }
        loop {
            let reading = self.reading.take();
            let msg = if rx.has_buffered() {
                // The next item is at hand: nothing to wait for, so no select. The stop request
                // and the heartbeat come first, as in the select below.
                match before_taking(&mut stop, heartbeat, reading) {
                    Before::Stop => return SessionEnd::Stop,
                    Before::Save => {
                        if let Err(h) = self.progress.save().await {
                            return SessionEnd::Halt(h);
                        }
                        continue;
                    }
                    Before::Take => {}
                }
                rx.take_buffered()
            } else {
                match self.serving_while(rx.recv(), &mut stop, heartbeat).await {
                    Ok(msg) => msg,
                    Err(end) => return end,
                }
            };
            match self.on_read(msg) {
                Read::Nothing => {}
                Read::End(end) => return end,
                Read::Event(admitted) => {
                    if let Some(end) = self.on_event(admitted, heartbeat, &mut stop).await {
                        return end;
                    }
                }
            }
        }
    }

    /// `concurrency = 1` over a cursor that answers from memory ([`ReadMode::InProcess`]): the
    /// stream's task reads each event when it takes it, so nothing crosses a channel and an
    /// event is handled while the cursor's work on it is still in the CPU cache. A `next()`
    /// that has to wait (for new changes) is raced against a stop, the write behind and the
    /// heartbeat, and is never dropped until it answers or the session ends.
    async fn serial_in_process(
        &mut self,
        cursor: &mut Box<dyn ChangeCursor>,
        heartbeat: &mut Option<Heartbeat>,
    ) -> SessionEnd {
        let mut stop = self.env.stop.clone();
        if *stop.borrow_and_update() {
            return SessionEnd::Stop;
        }
        let mut taken: u32 = 0;
        loop {
            match before_taking(&mut stop, heartbeat, self.reading.take()) {
                Before::Stop => return SessionEnd::Stop,
                Before::Save => {
                    if let Err(h) = self.progress.save().await {
                        return SessionEnd::Halt(h);
                    }
                    continue;
                }
                Before::Take => {}
            }
            taken = taken.wrapping_add(1);
            if taken.is_multiple_of(EVENTS_PER_BUDGET_UNIT) {
                // A cursor at hand never waits, so nothing else spends the task's cooperative
                // budget: this does, and the task yields to the others now and then.
                tokio::task::coop::consume_budget().await;
            }
            let msg = {
                let mut next = cursor.next();
                match futures::poll!(&mut next) {
                    Poll::Ready(item) => item,
                    Poll::Pending => match self.serving_while(next, &mut stop, heartbeat).await {
                        Ok(item) => item,
                        Err(end) => return end,
                    },
                }
            };
            match self.on_read(Some(msg)) {
                Read::Nothing => {}
                Read::End(end) => return end,
                Read::Event(admitted) => {
                    if let Some(end) = self.on_event(admitted, heartbeat, &mut stop).await {
                        return end;
                    }
                }
            }
        }
    }

    /// Waits for `read` (the next item) while serving a stop request, the checkpoint write
    /// behind the stream and the heartbeat, in that order of priority. `read` is kept across
    /// them, never dropped, until it answers or the session ends.
    async fn serving_while<T>(
        &mut self,
        read: impl Future<Output = T>,
        stop: &mut watch::Receiver<bool>,
        heartbeat: &mut Option<Heartbeat>,
    ) -> Result<T, SessionEnd> {
        let mut read = std::pin::pin!(read);
        loop {
            tokio::select! {
                biased;
                _ = stopped(stop) => return Err(SessionEnd::Stop),
                finished = in_flight_finished(&mut self.progress.in_flight) => {
                    self.progress.finish(finished).map_err(SessionEnd::Halt)?;
                }
                _ = tick(heartbeat) => self.progress.save().await.map_err(SessionEnd::Halt)?,
                item = &mut read => return Ok(item),
            }
        }
    }

    /// Takes one message of the reader: an idle token is registered here; an event is
    /// registered with the tracker and returned for processing.
    pub(super) fn on_read(&mut self, msg: Option<ReadResult>) -> Read {
        match msg {
            None => Read::End(SessionEnd::Source(SourceError::new(
                SourceErrorKind::Resumable,
                "the reader task ended unexpectedly",
            ))),
            Some(Err(e)) => Read::End(SessionEnd::Source(e)),
            Some(Ok(None)) => Read::End(SessionEnd::Source(SourceError::new(
                SourceErrorKind::Resumable,
                "the source closed the cursor",
            ))),
            Some(Ok(Some(SourceItem::Idle(token)))) => {
                self.restart_failures = 0;
                if let Some(token) = token {
                    self.receive_idle(token);
                }
                Read::Nothing
            }
            Some(Ok(Some(SourceItem::Event(raw)))) => self.admit_read(Ok(raw)),
            // Decoded here, on the stream's task: see `SourceItem::Encoded`.
            Some(Ok(Some(SourceItem::Encoded(bytes)))) => self.admit_read(
                bson::Document::try_from(bytes).map_err(|e| format!("not valid BSON: {e}")),
            ),
        }
    }

    /// Admits an event read from the cursor (decoded, or why it could not be).
    fn admit_read(&mut self, raw: Result<bson::Document, String>) -> Read {
        self.restart_failures = 0;
        match raw.and_then(|raw| ChangeEvent::from_raw(raw).map_err(|e| e.to_string())) {
            Ok(event) => Read::Event(self.admit(event)),
            Err(why) => Read::End(SessionEnd::Halt(Halt::new(
                HaltReason::SourceFatal,
                format!("stream '{}': the source delivered an event that cannot be identified ({why}); it cannot be checkpointed past, so the stream halts", self.def.name),
            ))),
        }
    }

    /// Counts an identified event and registers it with the tracker (seen, in flight).
    fn admit(&mut self, event: ChangeEvent) -> Admitted {
        let name = self.def.name;
        self.metrics.received.increment(1);
        self.env.probe.set_caught_up(false);
        let recent_key = RecentKey::of(event.token());
        let redelivered = self
            .recent
            .delivered_again(recent_key, event.cluster_time());
        if redelivered {
            self.metrics.redelivered.increment(1);
            debug!(stream = name, token = %event.token(), "event delivered again after it was settled; processing it again (at-least-once)");
        }
        self.env.status.count_received(event.wall_time());
        if redelivered {
            self.env.status.update(|s| s.counters.redelivered += 1);
        }
        let invalidate = *event.operation_type() == OperationType::Invalidate;
        let ticket = self.progress.tracker.receive(StoredPosition {
            token: event.token().clone(),
            cluster_time: event.cluster_time(),
            wall_time: event.wall_time(),
            start_after: invalidate,
        });
        Admitted {
            event,
            ticket,
            invalidate,
            recent_key,
        }
    }

    /// Records a settled event: the tracker, the redelivery memory, and the checkpoint when a
    /// save is due. `committed` is the checkpoint a transactional event's commit stored with
    /// it. `at` is when its handler returned, when one ran: that clock reading is reused, and
    /// the clock is read otherwise. Returns how the session ends, if it does (an invalidate, a
    /// failed save).
    pub(super) async fn settled(
        &mut self,
        admitted: &Admitted,
        how: Settlement,
        save_now: bool,
        committed: Option<Box<Checkpoint>>,
        at: Option<Instant>,
    ) -> Option<SessionEnd> {
        self.progress.tracker.settle(admitted.ticket, how);
        if let Some(checkpoint) = committed {
            self.progress.committed(*checkpoint);
        }
        let at = at.unwrap_or_else(Instant::now);
        self.publish_position(false, at);
        self.reading = Some(at);
        if how != Settlement::Filtered && how != Settlement::Unrouted {
            self.recent.insert(admitted.recent_key);
        }
        let due = save_now
            || self.progress.tracker.processed_since_save() >= self.def.checkpoint.save_every_n
            || admitted.invalidate;
        if due {
            // Behind the stream, except for a transactional stream: its checkpoint commits
            // with the events' writes, and no plain write may race a commit.
            let saved = if self.env.transactions.is_none() && !admitted.invalidate {
                self.progress.save_behind()
            } else {
                // Waits for the store: the reading is no longer recent.
                self.reading = None;
                self.progress.save().await
            };
            if let Err(h) = saved {
                return Some(SessionEnd::Halt(h));
            }
        }
        if admitted.invalidate {
            return Some(SessionEnd::Invalidated);
        }
        None
    }

    /// Processes one admitted event to settlement; returns how the session ends, if it does.
    async fn on_event(
        &mut self,
        admitted: Admitted,
        heartbeat: &mut Option<Heartbeat>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<SessionEnd> {
        let name = self.def.name;
        let event = &admitted.event;
        // A transactional event commits the checkpoint as it stands once the event is settled,
        // with its writes; the heartbeat must not write meanwhile (a plain write racing the
        // commit could land after it and put the checkpoint back).
        let transactions = self.env.transactions.clone();
        #[cfg(feature = "test-util")]
        let outside = self.env.options.checkpoint_outside_transaction;
        #[cfg(not(feature = "test-util"))]
        let outside = false;
        let txn = transactions.as_ref().map(|store| TxnCx {
            store,
            checkpoint: (!outside)
                .then(|| Box::new(self.progress.preview_handled(admitted.ticket))),
            #[cfg(feature = "test-util")]
            hook: self.env.options.transaction_hook.as_ref(),
        });
        let mut no_heartbeat = None;
        let heartbeat = if txn.is_some() {
            &mut no_heartbeat
        } else {
            heartbeat
        };
        let cx = ProcessCx::new(self.def, &self.env, &self.metrics, txn);
        let span = event_span(event);
        let mut deadline: Option<Instant> = None;
        let outcome = {
            // Pinned where it is made: a second binding would be a second copy of the future
            // in this one's state, and both are copied for every event.
            let mut fut =
                std::pin::pin!(
                    process_event(&self.handler, event, None, &cx, &mut self.rng).instrument(span)
                );
            loop {
                tokio::select! {
                    biased;
                    outcome = &mut fut => break Some(outcome),
                    _ = tick(heartbeat) => {
                        if let Err(h) = self.progress.save().await {
                            break Some(EventOutcome::Halt(h));
                        }
                    }
                    _ = stopped(stop), if deadline.is_none() => {
                        let timeout = self.env.options.shutdown_timeout;
                        info!(stream = name, timeout_ms = timeout.as_millis() as u64, "stop requested; waiting for the in-flight handler");
                        deadline = Some(Instant::now() + timeout);
                    }
                    _ = sleep_until(deadline), if deadline.is_some() => {
                        warn!(stream = name, token = %event.token(), "the in-flight handler did not finish within the shutdown timeout; the event stays unsettled and will be delivered again");
                        break None;
                    }
                }
            }
        };
        let committed_checkpoint = cx.txn.and_then(|t| t.checkpoint);
        let Some(outcome) = outcome else {
            if transactions.is_some() {
                // Abandoned mid-attempt: its commit may have been sent.
                self.progress.freeze();
            }
            return Some(SessionEnd::Stop);
        };
        match outcome {
            EventOutcome::Halt(h) => {
                if h.reason == HaltReason::TransactionOutcomeUnknown {
                    self.progress.freeze();
                }
                Some(SessionEnd::Halt(h))
            }
            EventOutcome::Settled {
                how,
                save_now,
                committed,
                at,
            } => {
                let stored = committed.then_some(committed_checkpoint).flatten();
                if let Some(end) = self.settled(&admitted, how, save_now, stored, at).await {
                    return Some(end);
                }
                deadline.map(|_| SessionEnd::Stop)
            }
        }
    }
}

/// What a serial session does before it takes an event at hand.
enum Before {
    /// A stop was requested.
    Stop,
    /// The heartbeat is due: save, then look again.
    Save,
    /// Take the event.
    Take,
}

/// Checks, between two events, for a stop request and then for a due heartbeat, on `reading`
/// (a clock reading taken just before, if the caller has one) or on a new one.
fn before_taking(
    stop: &mut watch::Receiver<bool>,
    heartbeat: &mut Option<Heartbeat>,
    reading: Option<Instant>,
) -> Before {
    if stop_requested(stop) {
        return Before::Stop;
    }
    let now = reading.unwrap_or_else(Instant::now);
    if heartbeat.as_mut().is_some_and(|h| h.try_tick(now)) {
        return Before::Save;
    }
    Before::Take
}

/// What one message of the reader asks of the session.
pub(super) enum Read {
    /// Nothing to process (an idle token, registered).
    Nothing,
    /// The session ends.
    End(SessionEnd),
    /// An event to process, registered with the tracker.
    Event(Admitted),
}

/// A received event, registered with the tracker and not yet settled.
pub(super) struct Admitted {
    pub(super) event: ChangeEvent,
    pub(super) ticket: Ticket,
    pub(super) invalidate: bool,
    /// The event's key in the redelivery memory, computed once on receipt.
    pub(super) recent_key: Option<RecentKey>,
}

/// The span every event's processing runs in.
pub(super) fn event_span(event: &ChangeEvent) -> tracing::Span {
    tracing::info_span!(
        "event",
        token = %event.token(),
        operation = %event.operation_type(),
    )
}

/// Events a serial in-process session takes per unit of Tokio's cooperative budget (128 units
/// a poll): it yields about every 2,000 events, as often as the hand-over's channel makes a
/// stream read ahead yield. A yield may move the task to another core, so not more often.
const EVENTS_PER_BUDGET_UNIT: u32 = 16;

fn heartbeat(def: &StreamDefinition) -> Option<Heartbeat> {
    let secs = def.checkpoint.save_interval_secs;
    (secs > 0).then(|| Heartbeat::new(Duration::from_secs(secs)))
}

pub(super) async fn tick(heartbeat: &mut Option<Heartbeat>) {
    match heartbeat {
        Some(heartbeat) => heartbeat.tick().await,
        None => std::future::pending::<()>().await,
    }
}

pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending::<()>().await,
    }
}
