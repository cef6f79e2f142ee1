//! The trait `#[change_stream]` implements, and the type-erased stream the runtime runs.

use std::any::TypeId;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::context::ChangeContext;
use crate::definition::StreamDefinition;
use crate::handler_error::{ErrorAction, HandlerError};

/// The future of one handler attempt.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'static>>;

/// A declared change stream: its definition, pipeline, filter and handlers.
///
/// `#[change_stream]` implements this for the annotated type; implementing it by hand is the
/// equivalent code without the macro (see `docs/attributes.md`).
pub trait StreamHandler: Send + Sync + 'static {
    /// The type `fullDocument` decodes into (`bson::Document` when none is declared).
    type Document: DeserializeOwned + Send + Sync + 'static;

    /// The static definition.
    fn definition() -> &'static StreamDefinition;

    /// The server-side pipeline stages that follow `$changeStream`.
    fn pipeline() -> Vec<bson::Document> {
        Vec::new()
    }

    /// The client-side filter, run after the pipeline; `false` settles the event unhandled.
    fn filter(&self, ctx: &ChangeContext<Self::Document>) -> bool {
        let _ = ctx;
        true
    }

    /// Starts the handler for this event's operation, or returns `None` when no handler
    /// (typed or `#[on_change]`) takes it.
    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Self::Document>>) -> Option<HandlerFuture>;

    /// `#[on_error]`: what to do after a failed attempt; `None` means the default (retry).
    fn on_error(
        &self,
        error: &HandlerError,
        ctx: &ChangeContext<Self::Document>,
    ) -> Option<ErrorAction> {
        let _ = (error, ctx);
        None
    }
}

/// Names the collection a document type lives in, so `#[change_stream(document = T)]` can
/// omit `collection`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not name its collection",
    label = "no collection for this document type",
    note = "set `collection = \"...\"` in #[change_stream(..)], or implement `flowwarden::CollectionName` for `{Self}`"
)]
pub trait CollectionName {
    /// The collection's name.
    const COLLECTION: &'static str;
}

/// A stream instance with its handler type erased, ready for the runtime.
#[derive(Clone)]
pub struct AnyStream {
    pub(crate) inner: Arc<dyn crate::engine::ErasedStream>,
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
            inner: Arc::new(crate::engine::TypedStream::new(handler, definition)),
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
