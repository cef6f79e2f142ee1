//! Idempotency for handlers (feature `dedup`): at-least-once delivers an event again after a
//! crash or a retry, so a handler whose effect is not idempotent by nature records which events
//! it applied, keyed by the stream and [`ChangeContext::event_id`], and skips the ones it has.
//!
//! ```ignore
//! async fn created(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
//!     self.dedup.once(ctx, || async { self.mailer.send_receipt(&order).await }).await
//! }
//! ```
//!
//! [`Idempotency::once`] runs the effect only when the event was not applied before and records
//! it only after the effect succeeded: a failed effect is retried by the engine and applied
//! then, never skipped. Between the effect and the record a crash can still apply it twice (the
//! record and the effect are not one transaction unless they live in the same store); keep the
//! window short, or write both in one transaction. The lower-level pair
//! [`Idempotency::first_time`] and [`Idempotency::mark_applied`] does the same in two steps.
//!
//! Every skip counts `flowwarden.events.duplicates_skipped` (label `stream`): a sudden rise means
//! something is looping or redelivering. Records expire after the store's time to live; size it
//! above the longest redelivery span (the time between checkpoints plus a restart), with room.
//! Stores: [`MemoryApplied`] (one process, lost on restart: tests and single-process tools),
//! `flowwarden_rs_mongo::MongoApplied` (`_fw_applied`, a TTL index) and
//! `flowwarden::redis::RedisApplied` (feature `redis`).

mod memory;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::debug;

use crate::context::ChangeContext;
use crate::handler_error::{HandlerError, HandlerErrorKind};
use crate::port::StoreError;

pub use memory::MemoryApplied;

/// The metric counting events skipped because they were applied before.
pub const DUPLICATES_SKIPPED: &str = "flowwarden.events.duplicates_skipped";

/// Where applied events are recorded.
#[async_trait]
pub trait AppliedStore: Send + Sync + 'static {
    /// Whether `key` is recorded (and not expired).
    async fn contains(&self, key: &str) -> Result<bool, StoreError>;

    /// Records `key` for `ttl`; recording it again extends nothing and is no error.
    async fn record(&self, key: &str, ttl: Duration) -> Result<(), StoreError>;
}

/// Skips events a handler already applied (see the module documentation).
#[derive(Clone)]
pub struct Idempotency {
    store: Arc<dyn AppliedStore>,
    ttl: Duration,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Idempotency {
    /// Records applied events in `store`, each for `ttl`.
    pub fn new(store: impl AppliedStore, ttl: Duration) -> Self {
        Self {
            store: Arc::new(store),
            ttl,
        }
    }

    /// Records applied events in this process's memory ([`MemoryApplied`]), each for `ttl`.
    pub fn in_memory(ttl: Duration) -> Self {
        Self::new(MemoryApplied::default(), ttl)
    }

    /// The record's key of an event: the stream's name and the event's id.
    pub fn key<T>(ctx: &ChangeContext<T>) -> String {
        format!("{}:{}", ctx.stream_name(), ctx.event_id())
    }

    /// `true` when the event was not applied before; `false` (counted as a skipped duplicate)
    /// when it was. Call [`Idempotency::mark_applied`] once the effect succeeded.
    pub async fn first_time<T>(&self, ctx: &ChangeContext<T>) -> Result<bool, HandlerError> {
        let key = Self::key(ctx);
        let applied = self.store.contains(&key).await.map_err(store_failure)?;
        if applied {
            metrics::counter!(DUPLICATES_SKIPPED, "stream" => ctx.stream_name()).increment(1);
            debug!(stream = ctx.stream_name(), event = %ctx.event_id(), "event applied before; skipped");
        }
        Ok(!applied)
    }

    /// Records the event as applied.
    pub async fn mark_applied<T>(&self, ctx: &ChangeContext<T>) -> Result<(), HandlerError> {
        self.store
            .record(&Self::key(ctx), self.ttl)
            .await
            .map_err(store_failure)
    }

    /// Runs `effect` unless the event was applied before, and records it once `effect`
    /// succeeded. A failing effect is returned as is (the engine retries it); a store failure
    /// is a retryable handler failure.
    pub async fn once<T, F, Fut, E>(
        &self,
        ctx: &ChangeContext<T>,
        effect: F,
    ) -> Result<(), HandlerError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<HandlerError>,
    {
        if !self.first_time(ctx).await? {
            return Ok(());
        }
        effect().await.map_err(Into::into)?;
        self.mark_applied(ctx).await
    }
}

/// A store failure is a retryable failure of the handler (the event is not settled).
fn store_failure(e: StoreError) -> HandlerError {
    HandlerError::with_kind(HandlerErrorKind::Failed, e)
}
