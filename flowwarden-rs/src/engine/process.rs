//! The life of one event after it is received: decode, filter, route, attempt, retry,
//! dead-letter. Returns how the event was settled, or a halt that leaves it unsettled.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;
use futures::FutureExt;
use tracing::{debug, error, warn};

use super::metrics::StreamMetrics;
use super::{EngineOptions, Rng, StreamEnv};
use crate::context::ChangeContext;
use crate::definition::StreamDefinition;
use crate::engine::tracker::Settlement;
use crate::engine::transaction::{self, TransientRetries, TxnAttempt, TxnCx};
use crate::event::ChangeEvent;
use crate::handler::{HandlerFuture, StreamHandler};
use crate::handler_error::{ErrorAction, HandlerError, HandlerErrorKind};
use crate::port::Fence;
use crate::port::{DeadLetterRecord, DeadLetterStatus, DeadLetterStore, PutOutcome};
use crate::port::{StoreError, StoreErrorKind};
use crate::status::{Halt, HaltReason, StatusCell};

/// The result of processing one event.
#[derive(Debug)]
pub(crate) enum EventOutcome {
    /// Settled; the checkpoint may move past it. `committed`: the event's transaction
    /// committed with the checkpoint of [`ProcessCx::txn`] (it is stored already).
    Settled {
        how: Settlement,
        save_now: bool,
        committed: bool,
        /// When the handler returned, when one ran: a clock reading the caller may reuse.
        at: Option<tokio::time::Instant>,
    },
    /// The stream must halt; the event stays unsettled.
    Halt(Halt),
}

/// What processing needs besides the handler and the event.
pub(crate) struct ProcessCx<'a> {
    pub(crate) def: &'static StreamDefinition,
    pub(crate) dead_letters: Option<&'a Arc<dyn DeadLetterStore>>,
    pub(crate) options: &'a EngineOptions,
    pub(crate) metrics: &'a StreamMetrics,
    pub(crate) status: &'a StatusCell,
    pub(crate) fence: Option<&'a Fence>,
    /// For `transactional = true` streams: each attempt runs in a transaction that commits
    /// the handler's writes with this checkpoint.
    pub(crate) txn: Option<TxnCx<'a>>,
}

impl<'a> ProcessCx<'a> {
    /// The context of one stream's processing: its dead-letter store, options, metrics,
    /// status and fence, and the transaction of a transactional event.
    pub(crate) fn new(
        def: &'static StreamDefinition,
        env: &'a StreamEnv,
        metrics: &'a StreamMetrics,
        txn: Option<TxnCx<'a>>,
    ) -> Self {
        Self {
            def,
            dead_letters: env.dead_letters.as_ref(),
            options: &env.options,
            metrics,
            status: &env.status,
            fence: env.fence.as_ref(),
            txn,
        }
    }
}

/// Runs a handler attempt, turning a panic into a failure.
pub(crate) async fn catch_panic(fut: HandlerFuture) -> Result<(), HandlerError> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => Err(HandlerError::from_panic(payload)),
    }
}

/// Runs the filter, turning a panic into a failure.
pub(crate) fn call_filter<H: StreamHandler>(
    handler: &H,
    ctx: &ChangeContext<H::Document>,
) -> Result<bool, HandlerError> {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.filter(ctx))).map_err(|payload| {
        let mut e = HandlerError::from_panic(payload);
        e = HandlerError::kind_msg(
            HandlerErrorKind::Panicked,
            format!(
                "filter {}",
                e.chain().join(": ").trim_start_matches("handler ")
            ),
        );
        e
    })
}

fn on_error_action<H: StreamHandler>(
    handler: &H,
    err: &HandlerError,
    ctx: &ChangeContext<H::Document>,
) -> ErrorAction {
    if !err.kind().is_retryable() {
        return ErrorAction::DeadLetter;
    }
    match std::panic::catch_unwind(AssertUnwindSafe(|| handler.on_error(err, ctx))) {
        Ok(Some(action)) => action,
        Ok(None) => ErrorAction::Retry,
        Err(_) => {
            warn!(
                stream = ctx.stream_name(),
                "#[on_error] panicked; using the default action (retry)"
            );
            ErrorAction::Retry
        }
    }
}

fn retry_delay(def: &StreamDefinition, attempt: u32, rng: &mut Rng) -> Duration {
    let base = def.retry.base_delay(attempt);
    if def.retry.jitter {
        base.mul_f64(0.5 + 0.5 * rng.next_f64())
    } else {
        base
    }
}

/// Runs the `#[key]` method, turning a panic into `Err` (the caller decides what the event is
/// ordered by then).
pub(crate) fn call_key<H: StreamHandler>(
    handler: &H,
    ctx: &ChangeContext<H::Document>,
) -> Result<Option<u64>, HandlerError> {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.key(ctx)))
        .map_err(HandlerError::from_panic)
}

/// Processes one received event to settlement (or halt). `decoded` is the event's context
/// when the caller already decoded it (the keyed session does, on receipt, to compute the
/// key); otherwise it is decoded here.
pub(crate) async fn process_event<H: StreamHandler>(
    handler: &Arc<H>,
    event: &ChangeEvent,
    decoded: Option<Arc<ChangeContext<H::Document>>>,
    cx: &ProcessCx<'_>,
    rng: &mut Rng,
) -> EventOutcome {
    let name = cx.def.name;
    let decoded = match decoded {
        Some(ctx) => Ok(ctx),
        None => ChangeContext::<H::Document>::decode(name, event.clone()).map(Arc::new),
    };
    let ctx = match decoded {
        Ok(ctx) => ctx,
        Err(e) => {
            let err = HandlerError::with_kind(HandlerErrorKind::Decode, e);
            warn!(stream = name, token = %event.token(), error = %format!("{err:#}"), "undecodable event: dead-lettering it");
            let now = DateTime::now();
            return Box::pin(dead_letter_at(event, &err, 1, now, cx)).await;
        }
    };

    let mut attempt: u32 = 1;
    let mut first_failure: Option<DateTime> = None;
    let mut transient = TransientRetries::default();
    loop {
        ctx.set_attempt(attempt);
        let mut returned = None;
        let result = match call_filter(&**handler, &ctx) {
            Ok(false) => {
                cx.metrics.filtered.increment(1);
                cx.status.update(|s| s.counters.filtered += 1);
                return EventOutcome::Settled {
                    how: Settlement::Filtered,
                    save_now: false,
                    committed: false,
                    at: None,
                };
            }
            Ok(true) if cx.txn.is_some() => {
                let Some(txn) = cx.txn.as_ref() else {
                    unreachable!("checked by the guard");
                };
                match Box::pin(transaction::attempt(handler, &ctx, txn, cx.metrics)).await {
                    TxnAttempt::Committed => {
                        cx.metrics.handled.increment(1);
                        cx.status.count_handled();
                        cx.status
                            .update(|s| s.counters.transactions_committed += 1);
                        return EventOutcome::Settled {
                            how: Settlement::Handled,
                            save_now: false,
                            committed: true,
                            at: None,
                        };
                    }
                    TxnAttempt::Unrouted => return unrouted(event, cx),
                    TxnAttempt::Halt(h) => return EventOutcome::Halt(h),
                    TxnAttempt::Failed(e) => Err(e),
                    TxnAttempt::Retry {
                        message,
                        unavailable,
                    } => match transient.next_delay(rng.next_f64()) {
                        Some(delay) => {
                            transaction::log_retry(name, ctx.event_id().as_str(), &message, delay);
                            cx.status.update(|s| s.counters.transactions_retried += 1);
                            tokio::time::sleep(delay).await;
                            continue;
                        }
                        None if unavailable => {
                            let halt = Halt::new(HaltReason::SourceUnavailable, format!(
                                "stream '{name}': the transaction of event {} could not run for {} s ({message}); nothing was committed and the event will be delivered again on restart",
                                ctx.event_id(),
                                transaction::TRANSIENT_RETRY_WINDOW.as_secs()
                            ));
                            error!(stream = name, "{halt}");
                            return EventOutcome::Halt(halt);
                        }
                        None => Err(HandlerError::msg(format!(
                            "the transaction kept failing with transient errors for {} s ({} runs); last: {message}",
                            transaction::TRANSIENT_RETRY_WINDOW.as_secs(),
                            transient.count() + 1
                        ))),
                    },
                }
            }
            Ok(true) => match H::handle(handler.clone(), ctx.clone()) {
                None => return unrouted(event, cx),
                Some(fut) => {
                    let started = tokio::time::Instant::now();
                    let r = catch_panic(fut).await;
                    let ended = tokio::time::Instant::now();
                    cx.metrics
                        .handler_duration
                        .record((ended - started).as_secs_f64());
                    returned = Some(ended);
                    r
                }
            },
            Err(e) => Err(e),
        };

        let err = match result {
            Ok(()) => match ctx.take_dead_letter_request() {
                None => {
                    cx.metrics.handled.increment(1);
                    cx.status.count_handled();
                    return EventOutcome::Settled {
                        how: Settlement::Handled,
                        save_now: ctx.take_save_request(),
                        committed: false,
                        at: returned,
                    };
                }
                Some(reason) => {
                    HandlerError::kind_msg(HandlerErrorKind::DeadLetterRequested, reason)
                }
            },
            Err(e) => e,
        };

        let now = DateTime::now();
        let first = *first_failure.get_or_insert(now);
        let action = if err.kind() == HandlerErrorKind::DeadLetterRequested {
            ErrorAction::DeadLetter
        } else {
            on_error_action(&**handler, &err, &ctx)
        };
        match action {
            ErrorAction::Retry if attempt < cx.def.retry.max_attempts => {
                let delay = retry_delay(cx.def, attempt, rng);
                warn!(stream = name, event_id = %ctx.event_id(), attempt, error = %format!("{err:#}"), delay_ms = delay.as_millis() as u64, "handler failed; retrying");
                cx.metrics.retried.increment(1);
                cx.status.update(|s| s.counters.retried += 1);
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            ErrorAction::Retry | ErrorAction::DeadLetter => {
                return Box::pin(dead_letter_at(event, &err, attempt, first, cx)).await;
            }
            ErrorAction::Skip => {
                warn!(stream = name, event_id = %ctx.event_id(), operation = %event.operation_type(), error = %format!("{err:#}"), "event skipped by #[on_error] (ErrorAction::Skip)");
                cx.metrics.skipped.increment(1);
                cx.status.update(|s| s.counters.skipped += 1);
                return EventOutcome::Settled {
                    how: Settlement::Skipped,
                    save_now: false,
                    committed: false,
                    at: None,
                };
            }
            ErrorAction::Halt => {
                return EventOutcome::Halt(Halt::new(
                    HaltReason::HaltRequested,
                    format!(
                        "stream '{name}' halted by #[on_error] on event {} ({}): {err:#}",
                        ctx.event_id(),
                        event.operation_type()
                    ),
                ));
            }
        }
    }
}

fn unrouted(event: &ChangeEvent, cx: &ProcessCx<'_>) -> EventOutcome {
    debug!(stream = cx.def.name, operation = %event.operation_type(), "no handler for this operation type");
    cx.metrics.unrouted.increment(1);
    cx.status.update(|s| s.counters.unrouted += 1);
    EventOutcome::Settled {
        how: Settlement::Unrouted,
        save_now: false,
        committed: false,
        at: None,
    }
}

async fn dead_letter_at(
    event: &ChangeEvent,
    err: &HandlerError,
    attempts: u32,
    first_failed_at: DateTime,
    cx: &ProcessCx<'_>,
) -> EventOutcome {
    let name = cx.def.name;
    let Some(store) = cx.dead_letters else {
        let halt = Halt::new(HaltReason::NoDeadLetterStore, format!(
                "stream '{name}': event {} ({}) failed after {attempts} attempt(s) and no dead-letter store is configured, so it cannot be set aside; the stream halts and the event will be delivered again on restart. Last error: {err:#}",
                event.token(),
                event.operation_type()
            ));
        error!(stream = name, "{halt}");
        return EventOutcome::Halt(halt);
    };
    let mut record = DeadLetterRecord {
        id: DeadLetterRecord::id_for(name, event.token()),
        stream: name.to_owned(),
        event: event.raw().clone(),
        truncated: false,
        token: event.token().detached(),
        operation_type: event.operation_type().as_str().to_owned(),
        document_key: event.document_key().cloned(),
        error_chain: err.chain(),
        error_kind: format!("{:?}", err.kind()),
        attempts,
        first_failed_at,
        last_failed_at: DateTime::now(),
        status: DeadLetterStatus::Pending,
        owner: cx.fence.map(|f| f.owner.clone()),
        epoch: cx.fence.map(|f| f.epoch),
    };
    record.truncate_to(store.max_record_bytes());
    let tries = cx.options.dead_letter_write_attempts.max(1);
    let mut last_err: Option<StoreError> = None;
    for attempt in 1..=tries {
        match store.put(&record).await {
            Ok(outcome) => {
                if outcome == PutOutcome::AlreadyPresent {
                    debug!(stream = name, id = %record.id, "dead-letter record already present (redelivery)");
                }
                error!(stream = name, id = %record.id, operation = %record.operation_type, attempts, error = %format!("{err:#}"), truncated = record.truncated, "event dead-lettered");
                cx.metrics.dead_lettered.increment(1);
                cx.status.update(|s| s.counters.dead_lettered += 1);
                return EventOutcome::Settled {
                    how: Settlement::DeadLettered,
                    save_now: false,
                    committed: false,
                    at: None,
                };
            }
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                return EventOutcome::Halt(Halt::new(
                    HaltReason::Fenced,
                    format!("stream '{name}': dead-letter write rejected: {}", e.message),
                ));
            }
            Err(e) => {
                warn!(stream = name, id = %record.id, attempt, error = %e, "dead-letter write failed; the event stays unsettled");
                last_err = Some(e);
                if attempt < tries {
                    tokio::time::sleep(cx.def.restart.delay(attempt)).await;
                }
            }
        }
    }
    let halt = Halt::new(HaltReason::DeadLetterStoreFailed, format!(
            "stream '{name}': could not store the dead-letter record for event {} after {tries} attempt(s) ({}); the event is not settled and will be delivered again on restart",
            event.token(),
            last_err.map(|e| e.to_string()).unwrap_or_default()
        ));
    error!(stream = name, "{halt}");
    EventOutcome::Halt(halt)
}
