//! A read session of a stream with `concurrency = N > 1`.
//!
//! Events are registered with the tracker in receive order (so the checkpoint stays the
//! contiguous settled prefix, whatever order they finish in), queued by key
//! ([`KeyedQueue`]; the key is the `documentKey` or the `#[key]` method's value, see
//! [`event_key`]), and started when their key and the bound allow. Their processing runs
//! concurrently inside the stream's task (handlers are async; blocking handlers already run on
//! the blocking pool). The reader is not read while `max_in_flight` events are received and
//! unsettled: backpressure, never an unbounded queue.
//!
//! Ending: a halt (from `#[on_error]` or the dead-letter path) stops starting events and waits
//! for the in-flight ones to settle, then ends; a stop request (which may mean the instance lost
//! its lease) does the same, up to the shutdown timeout. After a source error the events received
//! before the latest started one still start, so the settled prefix closes over what was
//! handled. Events that never started, or did not finish, stay unsettled and are delivered
//! again, and with them any later event already handled (at-least-once).

use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tracing::{info, warn, Instrument};

use super::backoff::stopped;
use super::checkpoint_writer::in_flight_finished;
use super::heartbeat::Heartbeat;
use super::session::{event_span, sleep_until, tick, Admitted, Read};
use super::{SessionEnd, Worker};
use crate::context::ChangeContext;
use crate::engine::keyed::{EventKey, KeyedQueue};
use crate::engine::metrics::StreamMetrics;
use crate::engine::process::{call_key, process_event, EventOutcome, ProcessCx};
use crate::engine::reader::Inbox;
use crate::engine::Rng;
use crate::event::ChangeEvent;
use crate::handler::StreamHandler;

impl<H: StreamHandler> Worker<H> {
    pub(super) async fn keyed_session(
        &mut self,
        rx: &mut Inbox,
        heartbeat: &mut Option<Heartbeat>,
    ) -> SessionEnd {
        let name = self.def.name;
        let limits = self.def.concurrency;
        let max_in_flight = limits.max_in_flight();
        // Owned by this frame, so the in-flight futures borrow them and not the worker, which
        // the loop below keeps updating.
        let handler = self.handler.clone();
        let dead_letters = self.env.dead_letters.clone();
        let options = self.env.options.clone();
        let metrics: StreamMetrics = self.metrics.clone();
        let status = self.env.status.clone();
        let fence = self.env.fence.clone();
        // A transactional stream never runs keyed (startup refuses `concurrency > 1` with it).
        let cx = ProcessCx {
            def: self.def,
            dead_letters: dead_letters.as_ref(),
            options: &options,
            metrics: &metrics,
            status: &status,
            fence: fence.as_ref(),
            txn: None,
        };
        let mut queue: KeyedQueue<(Admitted, Decoded<H>)> = KeyedQueue::new(limits.concurrency());
        let mut running = FuturesUnordered::new();
        let mut stop = self.env.stop.clone();
        // Set once the session is ending: nothing more is read or started.
        let mut ending: Option<SessionEnd> = None;
        let mut deadline: Option<Instant> = None;

        loop {
            // After a source error, what was received before the latest started event still
            // starts, so the settled prefix closes over what was handled (fewer redeliveries).
            let may_start = match &ending {
                None | Some(SessionEnd::Source(_)) => true,
                Some(_) => false,
            };
            if may_start {
                while let Some((key, (admitted, decoded))) = queue.next_ready() {
                    let mut rng = Rng::new(self.rng.next_u64());
                    let span = event_span(&admitted.event);
                    let (handler, cx) = (&handler, &cx);
                    running.push(
                        async move {
                            let outcome =
                                process_event(handler, &admitted.event, decoded, cx, &mut rng)
                                    .await;
                            (key, admitted, outcome)
                        }
                        .instrument(span),
                    );
                }
            }
            if ending.is_some() && running.is_empty() {
                return ending.unwrap_or(SessionEnd::Stop);
            }
            let may_read = ending.is_none() && self.progress.tracker.unsettled() < max_in_flight;
            tokio::select! {
                biased;
                _ = stopped(&mut stop), if deadline.is_none() => {
                    // Nothing new starts after a stop: it may mean this instance lost its
                    // lease. What was received and not started is delivered again.
                    queue.clear_waiting();
                    let timeout = options.shutdown_timeout;
                    if !running.is_empty() {
                        info!(stream = name, in_flight = running.len(), timeout_ms = timeout.as_millis() as u64, "stop requested; waiting for the in-flight handlers");
                    }
                    deadline = Some(Instant::now() + timeout);
                    ending.get_or_insert(SessionEnd::Stop);
                }
                finished = in_flight_finished(&mut self.progress.in_flight) => {
                    if let Err(h) = self.progress.finish(finished) {
                        return SessionEnd::Halt(h);
                    }
                }
                _ = tick(heartbeat) => {
                    if let Err(h) = self.progress.save().await {
                        return SessionEnd::Halt(h);
                    }
                }
                Some((key, admitted, outcome)) = running.next(), if !running.is_empty() => {
                    queue.finish(key);
                    match outcome {
                        EventOutcome::Halt(h) => {
                            info!(stream = name, in_flight = running.len(), "halting once the in-flight handlers settle");
                            queue.clear_waiting();
                            if !matches!(ending, Some(SessionEnd::Halt(_))) {
                                ending = Some(SessionEnd::Halt(h));
                            }
                        }
                        EventOutcome::Settled { how, save_now, at, .. } => {
                            match self.settled(&admitted, how, save_now, None, at).await {
                                None => {}
                                // A failed save (fenced, store down): nothing else may be
                                // stored, so the session ends now.
                                Some(SessionEnd::Halt(h)) => return SessionEnd::Halt(h),
                                // An invalidate is a barrier: nothing else is in flight.
                                Some(end) => {
                                    queue.clear_waiting();
                                    ending = Some(end);
                                }
                            }
                        }
                    }
                }
                msg = rx.recv(), if may_read => {
                    match self.on_read(msg) {
                        Read::Nothing => {}
                        Read::Event(admitted) => {
                            let (key, decoded) = event_key(&*handler, name, &admitted.event);
                            #[cfg(feature = "test-util")]
                            let key = if options.unkeyed_concurrency {
                                // The bug: every event its own key, no barriers.
                                EventKey::Key(admitted.ticket.seq())
                            } else {
                                key
                            };
                            queue.push(admitted.ticket.seq(), key, (admitted, decoded));
                        }
                        Read::End(end) => {
                            if matches!(end, SessionEnd::Source(_)) {
                                queue.keep_gaps_before_started();
                            } else {
                                queue.clear_waiting();
                            }
                            if !running.is_empty() {
                                info!(stream = name, in_flight = running.len(), "the session is ending; waiting for the in-flight handlers");
                            }
                            ending = Some(end);
                        }
                    }
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    warn!(stream = name, in_flight = running.len(), "in-flight handlers did not finish within the shutdown timeout; their events stay unsettled and will be delivered again");
                    return ending.unwrap_or(SessionEnd::Stop);
                }
            }
        }
    }
}

/// An event's context, when it was decoded on receipt to compute its key.
type Decoded<H> = Option<Arc<ChangeContext<<H as StreamHandler>::Document>>>;

/// What orders a received event, and its context when it was decoded to compute that.
///
/// - No document key (`drop`, `rename`, `dropDatabase`, `invalidate`, unknown types): a
///   barrier, whatever the `#[key]` method would say; it is not called, nothing is decoded.
/// - Otherwise the event is decoded once, here (processing reuses the context), and
///   [`StreamHandler::key`] decides: its hash, or the `documentKey` when it returns `None`
///   (no `#[key]` method).
/// - A document that does not decode into the stream's type: ordered by its `documentKey`;
///   processing decodes it again and takes the usual failure path (dead letter).
/// - A `#[key]` method that panics: a barrier (ordered against everything: never less order
///   than asked for).
fn event_key<H: StreamHandler>(
    handler: &H,
    name: &'static str,
    event: &ChangeEvent,
) -> (EventKey, Decoded<H>) {
    let Some(document_key) = event.document_key() else {
        return (EventKey::Barrier, None);
    };
    let Ok(ctx) = ChangeContext::<H::Document>::decode(name, event.clone()) else {
        return (EventKey::of_document_key(Some(document_key)), None);
    };
    let key = match call_key(handler, &ctx) {
        Ok(Some(hash)) => EventKey::Key(hash),
        Ok(None) => EventKey::of_document_key(Some(document_key)),
        Err(e) => {
            warn!(stream = name, event_id = %ctx.event_id(), error = %format!("{e:#}"), "#[key] panicked; ordering the event as a barrier");
            EventKey::Barrier
        }
    };
    (key, Some(Arc::new(ctx)))
}
