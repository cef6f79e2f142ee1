//! The stream engine: reading, routing, retrying, dead-lettering and checkpointing one stream.

mod checkpoint_guard;
mod leader;
mod metrics;
mod process;
mod reader;
mod resume;
mod rng;
mod worker;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::watch;

use crate::checkpoint::CheckpointStore;
use crate::context::ChangeContext;
use crate::dead_letter::DeadLetterStore;
use crate::definition::{LeaseConfig, StreamDefinition};
use crate::event::ChangeEvent;
use crate::handler::StreamHandler;
use crate::handler_error::{HandlerError, HandlerErrorKind};
use crate::lease::Fence;
use crate::source::ChangeSource;
use crate::status::{Halt, StatusCell};

pub(crate) use checkpoint_guard::{guard_name, run_guarded};
pub(crate) use leader::run_single_leader;
pub(crate) use rng::Rng;

/// Engine settings shared by every stream of a runtime.
#[derive(Debug, Clone)]
pub(crate) struct EngineOptions {
    pub(crate) shutdown_timeout: Duration,
    pub(crate) batch_size: u32,
    pub(crate) max_await: Duration,
    pub(crate) default_database: String,
    pub(crate) seed: u64,
    pub(crate) dead_letter_write_attempts: u32,
    pub(crate) checkpoint_on_receipt: bool,
    /// Timing of the checkpoint guard of `AllInstances` streams without a configured identity.
    pub(crate) checkpoint_guard: LeaseConfig,
}

/// Everything one stream task needs from the runtime.
pub(crate) struct StreamEnv {
    pub(crate) source: Arc<dyn ChangeSource>,
    pub(crate) checkpoints: Arc<dyn CheckpointStore>,
    pub(crate) dead_letters: Option<Arc<dyn DeadLetterStore>>,
    pub(crate) status: Arc<StatusCell>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) options: Arc<EngineOptions>,
    /// The `_id` of this stream's checkpoint (the stream name, or `name@instance`).
    pub(crate) checkpoint_key: String,
    /// The leader's fence (`SingleLeader` streams while they hold the lease).
    pub(crate) fence: Option<Fence>,
    /// This instance's identity, stamped as the owner of every checkpoint it writes.
    pub(crate) instance: String,
}

/// How a stream task ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StreamExit {
    /// Stopped on request, progress flushed.
    Stopped,
    /// Halted; the status names the runbook.
    Halted(Halt),
}

/// A stream with its handler type erased.
pub(crate) trait ErasedStream: Send + Sync + 'static {
    fn definition(&self) -> &'static StreamDefinition;
    fn run(&self, env: StreamEnv) -> BoxFuture<'static, StreamExit>;
    fn replay(&self, raw: bson::Document) -> BoxFuture<'static, Result<(), HandlerError>>;
}

/// The typed side of [`ErasedStream`].
pub(crate) struct TypedStream<H: StreamHandler> {
    handler: Arc<H>,
    def: &'static StreamDefinition,
}

impl<H: StreamHandler> TypedStream<H> {
    pub(crate) fn new(handler: H, def: &'static StreamDefinition) -> Self {
        Self {
            handler: Arc::new(handler),
            def,
        }
    }
}

impl<H: StreamHandler> ErasedStream for TypedStream<H> {
    fn definition(&self) -> &'static StreamDefinition {
        self.def
    }

    fn run(&self, env: StreamEnv) -> BoxFuture<'static, StreamExit> {
        worker::run_stream(self.handler.clone(), self.def, env).boxed()
    }

    fn replay(&self, raw: bson::Document) -> BoxFuture<'static, Result<(), HandlerError>> {
        let handler = self.handler.clone();
        let name = self.def.name;
        async move {
            let event = ChangeEvent::from_raw(raw)
                .map_err(|e| HandlerError::kind_msg(HandlerErrorKind::Decode, e))?;
            let ctx = ChangeContext::<H::Document>::decode(name, Arc::new(event))
                .map_err(|e| HandlerError::with_kind(HandlerErrorKind::Decode, e))?;
            let ctx = Arc::new(ctx);
            if !process::call_filter(&*handler, &ctx)? {
                return Ok(());
            }
            match H::handle(handler, ctx) {
                Some(fut) => process::catch_panic(fut).await,
                None => Ok(()),
            }
        }
        .boxed()
    }
}

/// Turns a caught panic payload into a handler failure.
pub(crate) fn panic_error(payload: Box<dyn Any + Send>) -> HandlerError {
    let message = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    };
    HandlerError::kind_msg(
        HandlerErrorKind::Panicked,
        format!("handler panicked: {message}"),
    )
}
