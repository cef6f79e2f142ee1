//! The trait `#[change_stream]` implements (what a declared stream is, for users and the
//! generated code). The engine runs it through [`crate::AnyStream`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::context::ChangeContext;
use crate::definition::StreamDefinition;
use crate::handler_error::{ErrorAction, HandlerError};
use crate::port::HandleType;

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

    /// `#[key]`: the hash of the key that orders this event against others when the stream
    /// runs with `concurrency = N > 1`; `None` (the default) orders it by its `documentKey`.
    ///
    /// Events whose keys hash equally run one at a time, in stream order; different keys run in
    /// parallel. It is called once per event, when the event is received, and only for events
    /// with a document key whose document decoded into [`Self::Document`]: events without a
    /// document key (`drop`, `rename`, `dropDatabase`, `invalidate`, unknown types) are
    /// barriers whatever this returns, and an event that does not decode is ordered by its
    /// `documentKey` (and then dead-lettered, as with `concurrency = 1`). A panic here makes the
    /// event a barrier. With `concurrency = 1` it is never called.
    ///
    /// The generated code hashes the user's value with the standard library's
    /// `DefaultHasher`; a hand-written implementation may return any 64-bit hash.
    fn key(&self, ctx: &ChangeContext<Self::Document>) -> Option<u64> {
        let _ = ctx;
        None
    }

    /// The transaction handle types the handlers take (`&Transaction` parameters of a
    /// `transactional = true` stream), checked at startup against the backend's
    /// [`crate::port::TransactionStore::handle_type`]. Empty by default.
    fn transaction_types() -> Vec<HandleType> {
        Vec::new()
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
