//! A declared stream with its handler type erased: what the runtime holds and starts, and the
//! one place the engine turns a typed handler into a running stream or a replay.

use std::any::TypeId;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{process, worker, StreamEnv, StreamExit};
use crate::context::ChangeContext;
use crate::definition::StreamDefinition;
use crate::event::ChangeEvent;
use crate::handler::StreamHandler;
use crate::handler_error::{HandlerError, HandlerErrorKind};

/// A stream instance with its handler type erased, ready for the runtime.
#[derive(Clone)]
pub struct AnyStream {
    pub(crate) inner: Arc<dyn ErasedStream>,
    pub(crate) type_id: TypeId,
}

impl AnyStream {
    /// Wraps a constructed handler instance.
    pub fn new<H: StreamHandler>(handler: H) -> Self {
        Self::with_definition(handler, H::definition())
    }

    /// Wraps a handler instance with a definition other than its declared one (for tests and
    /// simulations that vary settings, or for running one handler type as several streams).
    pub fn with_definition<H: StreamHandler>(
        handler: H,
        definition: &'static StreamDefinition,
    ) -> Self {
        Self {
            inner: Arc::new(TypedStream::new(handler, definition)),
            type_id: TypeId::of::<H>(),
        }
    }

    /// The stream's definition.
    pub fn definition(&self) -> &'static StreamDefinition {
        self.inner.definition()
    }
}

impl std::fmt::Debug for AnyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyStream")
            .field("name", &self.definition().name)
            .finish()
    }
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
