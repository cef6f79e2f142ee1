//! One attempt of a `transactional = true` stream: begin a transaction, run the handler with
//! its handle, and commit the handler's writes together with the checkpoint that moves past
//! the event, or abort. See `docs/exactly-once.md`.
//!
//! What each outcome means for the event: only [`TxnAttempt::Committed`] settles it (the
//! checkpoint is then already stored, inside the same commit). Every other outcome committed
//! nothing, so running the handler again can never apply its writes twice; the one exception,
//! an unknown commit result, halts the stream instead of guessing.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::metrics::StreamMetrics;
use super::process::catch_panic;
use crate::context::ChangeContext;
use crate::handler::StreamHandler;
use crate::handler_error::{HandlerError, HandlerErrorKind};
use crate::port::{Checkpoint, TransactionErrorKind, TransactionStore};
use crate::status::{Halt, HaltReason};

/// How long transient transaction errors are retried (the whole transaction, handler
/// included) before the attempt counts as a failure: the limit the MongoDB drivers' own
/// `withTransaction` helper uses.
pub(crate) const TRANSIENT_RETRY_WINDOW: Duration = Duration::from_secs(120);

/// A step of a transactional attempt, for tests that crash the process there (feature
/// `test-util`, [`crate::Builder::on_transaction_step`]).
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStep {
    /// The handler returned successfully; the commit (with the checkpoint) is about to be sent.
    BeforeCommit,
    /// The commit returned successfully; the runtime has not yet recorded the event settled.
    AfterCommit,
}

/// A callback run (and awaited) at each [`TransactionStep`] (feature `test-util`).
#[cfg(feature = "test-util")]
#[derive(Clone)]
pub(crate) struct TransactionHook(
    pub(crate) Arc<dyn Fn(TransactionStep) -> futures::future::BoxFuture<'static, ()> + Send + Sync>,
);

#[cfg(feature = "test-util")]
impl std::fmt::Debug for TransactionHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransactionHook")
    }
}

/// What a transactional attempt needs besides the handler and the event.
pub(crate) struct TxnCx<'a> {
    pub(crate) store: &'a Arc<dyn TransactionStore>,
    /// The checkpoint as it stands once this event is settled, stamped with the writer's
    /// identity and epoch: written inside the transaction. `None` writes no checkpoint (a
    /// dead-letter replay). Boxed, so that the context every event's processing holds stays
    /// small for streams without transactions.
    pub(crate) checkpoint: Option<Box<Checkpoint>>,
    #[cfg(feature = "test-util")]
    pub(crate) hook: Option<&'a TransactionHook>,
}

/// How one transactional attempt ended.
pub(crate) enum TxnAttempt {
    /// The handler succeeded and its writes committed together with the checkpoint.
    Committed,
    /// No handler takes the event; nothing was begun.
    Unrouted,
    /// The handler failed or asked for a dead letter; nothing was committed.
    Failed(HandlerError),
    /// Nothing was committed, and the whole transaction may succeed if run again:
    /// `unavailable` when the database could not be reached at all.
    Retry { message: String, unavailable: bool },
    /// The stream must halt (fenced, or the commit's outcome is unknown).
    Halt(Halt),
}

/// Runs one attempt of `handler` for `ctx` inside a transaction of `txn.store`.
pub(crate) async fn attempt<H: StreamHandler>(
    handler: &Arc<H>,
    ctx: &Arc<ChangeContext<H::Document>>,
    txn: &TxnCx<'_>,
    metrics: &StreamMetrics,
) -> TxnAttempt {
    let name = ctx.stream_name();
    let key = txn.checkpoint.as_ref().map_or(name, |c| c.stream.as_str());
    let open = match txn.store.begin(key).await {
        Ok(open) => open,
        Err(e) => {
            return TxnAttempt::Retry {
                unavailable: e.kind != TransactionErrorKind::Transient,
                message: format!("beginning the transaction failed: {}", e.message),
            }
        }
    };
    ctx.set_transaction(Some(open.handle()));
    let Some(fut) = H::handle(handler.clone(), ctx.clone()) else {
        ctx.set_transaction(None);
        open.abort().await;
        return TxnAttempt::Unrouted;
    };
    let limit = txn.store.lifetime_limit();
    let started = Instant::now();
    let ran = tokio::time::timeout(limit, catch_panic(fut)).await;
    metrics
        .handler_duration
        .record(started.elapsed().as_secs_f64());
    ctx.set_transaction(None);
    let ran = match ran {
        Ok(r) => r,
        Err(_) => Err(HandlerError::msg(format!(
            "the handler ran longer than the transaction lifetime limit ({} s, MongoDB's transactionLifetimeLimitSeconds): the database aborts such a transaction, so nothing was committed; make the handler faster or raise the limit on the server and in the backend's options (see docs/exactly-once.md)",
            limit.as_secs_f64()
        ))),
    };
    let failure = match ran {
        Ok(()) => ctx
            .take_dead_letter_request()
            .map(|reason| HandlerError::kind_msg(HandlerErrorKind::DeadLetterRequested, reason)),
        Err(e) => Some(e),
    };
    if let Some(err) = failure {
        let transient = open.is_transient(&err);
        open.abort().await;
        if transient {
            return TxnAttempt::Retry {
                message: format!("the handler hit a transient transaction error: {err:#}"),
                unavailable: false,
            };
        }
        return TxnAttempt::Failed(err);
    }
    // A save request changes nothing here: the checkpoint is written with the commit.
    let _ = ctx.take_save_request();
    #[cfg(feature = "test-util")]
    if let Some(hook) = txn.hook {
        (hook.0)(TransactionStep::BeforeCommit).await;
    }
    match open.commit(txn.checkpoint.as_deref()).await {
        Ok(()) => {
            #[cfg(feature = "test-util")]
            if let Some(hook) = txn.hook {
                (hook.0)(TransactionStep::AfterCommit).await;
            }
            debug!(stream = name, event_id = %ctx.event_id(), "transaction committed with the checkpoint");
            TxnAttempt::Committed
        }
        Err(e) => match e.kind {
            TransactionErrorKind::Transient => TxnAttempt::Retry {
                message: format!("the commit failed with a transient error: {}", e.message),
                unavailable: false,
            },
            TransactionErrorKind::Unavailable => TxnAttempt::Retry {
                message: format!("the commit could not reach the database: {}", e.message),
                unavailable: true,
            },
            TransactionErrorKind::Rejected => TxnAttempt::Failed(HandlerError::kind_msg(
                HandlerErrorKind::TransactionRejected,
                format!("the transaction cannot commit: {}", e.message),
            )),
            TransactionErrorKind::Fenced => TxnAttempt::Halt(Halt::new(
                HaltReason::Fenced,
                format!(
                    "stream '{name}': the transaction of event {} was not committed because its checkpoint is fenced (another instance took over): {}",
                    ctx.event_id(),
                    e.message
                ),
            )),
            TransactionErrorKind::CommitUnknown => {
                let halt = Halt::new(
                    HaltReason::TransactionOutcomeUnknown,
                    format!(
                        "stream '{name}': whether the transaction of event {} committed is unknown after retrying its commit ({}); the handler is not run again and the stream does not move on. Restart the stream: the checkpoint stored with the transaction (or the one before it) tells whether the event's writes are in",
                        ctx.event_id(),
                        e.message
                    ),
                );
                error!(stream = name, "{halt}");
                TxnAttempt::Halt(halt)
            }
        },
    }
}

/// Bookkeeping of transient retries of one event: the window they run in and the delay before
/// the next.
#[derive(Debug, Default)]
pub(crate) struct TransientRetries {
    first: Option<Instant>,
    count: u32,
}

impl TransientRetries {
    /// Registers a transient failure: the delay before the transaction runs again, or `None`
    /// when the window is spent (the failure then counts as an attempt of the handler).
    pub(crate) fn next_delay(&mut self, jitter: f64) -> Option<Duration> {
        let first = *self.first.get_or_insert_with(Instant::now);
        if first.elapsed() >= TRANSIENT_RETRY_WINDOW {
            self.first = None;
            self.count = 0;
            return None;
        }
        let base = Duration::from_millis(10).saturating_mul(1u32 << self.count.min(7));
        self.count += 1;
        Some(base.min(Duration::from_secs(1)).mul_f64(0.5 + 0.5 * jitter))
    }

    /// How many times the transaction was run again for this event.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }
}

/// Logs a transient retry.
pub(crate) fn log_retry(name: &str, ctx_id: &str, message: &str, delay: Duration) {
    warn!(
        stream = name,
        event_id = ctx_id,
        delay_ms = delay.as_millis() as u64,
        "{message}; running the transaction again (nothing was committed)"
    );
}
