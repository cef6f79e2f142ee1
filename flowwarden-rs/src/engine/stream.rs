//! A declared stream with its handler type erased: what the runtime holds and starts, and the
//! one place the engine turns a typed handler into a running stream or a replay.

use std::any::TypeId;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::metrics::StreamMetrics;
use super::transaction::{self, TxnAttempt, TxnCx};
use super::{process, worker, StreamEnv, StreamExit};
use crate::context::ChangeContext;
use crate::definition::StreamDefinition;
use crate::event::ChangeEvent;
use crate::handler::StreamHandler;
use crate::handler_error::{HandlerError, HandlerErrorKind};
use crate::port::{HandleType, TransactionStore};

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
    /// Runs a dead letter's event through the filter and handler once; inside a transaction
    /// of `transactions` (without a checkpoint) for a transactional stream.
    fn replay(
        &self,
        raw: bson::Document,
        transactions: Option<Arc<dyn TransactionStore>>,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
    /// The transaction handle types the handlers take.
    fn transaction_types(&self) -> Vec<HandleType>;
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

    fn transaction_types(&self) -> Vec<HandleType> {
        H::transaction_types()
    }

    fn replay(
        &self,
        raw: bson::Document,
        transactions: Option<Arc<dyn TransactionStore>>,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        let handler = self.handler.clone();
        let name = self.def.name;
        async move {
            let event = ChangeEvent::from_raw(raw)
                .map_err(|e| HandlerError::kind_msg(HandlerErrorKind::Decode, e))?;
            let ctx = ChangeContext::<H::Document>::decode(name, event)
                .map_err(|e| HandlerError::with_kind(HandlerErrorKind::Decode, e))?;
            let ctx = Arc::new(ctx);
            if !process::call_filter(&*handler, &ctx)? {
                return Ok(());
            }
            if let Some(store) = &transactions {
                let txn = TxnCx {
                    store,
                    checkpoint: None,
                    #[cfg(feature = "test-util")]
                    hook: None,
                };
                let metrics = StreamMetrics::new(name);
                return match transaction::attempt(&handler, &ctx, &txn, &metrics).await {
                    TxnAttempt::Committed | TxnAttempt::Unrouted => Ok(()),
                    TxnAttempt::Failed(e) => Err(e),
                    TxnAttempt::Retry { message, .. } => Err(HandlerError::msg(format!(
                        "{message}; nothing was committed, replay again"
                    ))),
                    TxnAttempt::Halt(h) => Err(HandlerError::msg(h.message)),
                };
            }
            match H::handle(handler, ctx) {
                Some(fut) => process::catch_panic(fut).await,
                None => Ok(()),
            }
        }
        .boxed()
    }
}
