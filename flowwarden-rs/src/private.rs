//! Support for the code the macros generate. Not a public API: names here may change in any
//! release. Generated code reaches the runtime only through this module.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

pub use ::bson;
pub use ::inventory;
pub use ::std;

pub use crate::context::ChangeContext;
pub use crate::definition::{
    CheckpointConfig, ConcurrencyConfig, Deployment, FullDocument, FullDocumentBeforeChange,
    LeaseConfig, OnHistoryLost, RestartConfig, ResumeStrategy, RetryConfig, SourceLocation,
    StartPosition, StreamDefinition,
};
pub use crate::engine::AnyStream;
pub use crate::event::OperationType;
pub use crate::handler::{CollectionName, HandlerFuture, StreamHandler};
pub use crate::handler_error::{ErrorAction, HandlerError, HandlerErrorKind, IntoHandlerResult};
pub use crate::registry::Registration;

pub use crate::port::{HandleType, TransactionHandleType};

/// The handle of the attempt's transaction as `T`, for a handler's `&Transaction` parameter;
/// a clear failure when there is none (the definition is not transactional, or the backend's
/// handle is another type: the startup checks make both impossible for declared streams).
pub fn transaction_handle<T: TransactionHandleType, D>(
    ctx: &ChangeContext<D>,
) -> Result<T, HandlerError> {
    ctx.transaction::<T>().ok_or_else(|| {
        HandlerError::msg(format!(
            "stream '{}': the handler takes a `&{}` but {}",
            ctx.stream_name(),
            std::any::type_name::<T>(),
            if ctx.in_transaction() {
                "the backend's transaction handle is another type"
            } else {
                "no transaction is open for this event (is the stream `transactional = true`?)"
            }
        ))
    })
}

/// Boxes an async handler attempt.
pub fn run_async<F>(fut: F) -> HandlerFuture
where
    F: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    Box::pin(fut)
}

/// Runs a plain (blocking) handler on Tokio's blocking pool; a panic becomes a failure.
pub fn run_blocking<F>(f: F) -> HandlerFuture
where
    F: FnOnce() -> Result<(), HandlerError> + Send + 'static,
{
    Box::pin(async move {
        match tokio::task::spawn_blocking(f).await {
            Ok(result) => result,
            Err(join) if join.is_panic() => Err(HandlerError::from_panic(join.into_panic())),
            Err(join) => Err(HandlerError::msg(format!(
                "blocking handler was cancelled: {join}"
            ))),
        }
    })
}

/// Type-level probe that builds a handler with `Default` when it has one (autoref
/// specialisation: `(&DefaultProbe::<H>::new()).build()` picks [`ViaDefault`] when `H: Default`,
/// else [`ViaNothing`]).
pub struct DefaultProbe<H>(PhantomData<H>);

impl<H> DefaultProbe<H> {
    /// A probe for `H`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<H> Default for DefaultProbe<H> {
    fn default() -> Self {
        Self::new()
    }
}

/// Chosen when the handler type implements `Default`.
pub trait ViaDefault {
    /// Builds the stream.
    fn build(&self) -> Option<AnyStream>;
}

impl<H: StreamHandler + Default> ViaDefault for DefaultProbe<H> {
    fn build(&self) -> Option<AnyStream> {
        Some(AnyStream::new(H::default()))
    }
}

/// Chosen when the handler type has no `Default`: the builder must supply an instance.
pub trait ViaNothing {
    /// Returns `None`.
    fn build(&self) -> Option<AnyStream>;
}

impl<H: StreamHandler> ViaNothing for &DefaultProbe<H> {
    fn build(&self) -> Option<AnyStream> {
        None
    }
}

/// What a `#[pipeline]` may return: the stages that follow `$changeStream`. Generated code
/// checks the bound on the user's return type, so a wrong type is reported there.
#[diagnostic::on_unimplemented(
    message = "a #[pipeline] must return `Vec<bson::Document>`, not `{Self}`",
    label = "this return type is not accepted",
    note = "build the stages with `bson::doc!`: `vec![doc! {{ \"$match\": {{ .. }} }}]`"
)]
pub trait PipelineStages {
    /// The stages.
    fn into_stages(self) -> Vec<bson::Document>;
}

impl PipelineStages for Vec<bson::Document> {
    fn into_stages(self) -> Vec<bson::Document> {
        self
    }
}

/// What a `#[key]` may return: any `Hash` value. Generated code hashes the key through this
/// trait, spanned on the user's return type, so a key that is not `Hash` is reported there.
#[diagnostic::on_unimplemented(
    message = "a #[key] must return a value that implements `Hash`, not `{Self}`",
    label = "this key type is not `Hash`",
    note = "return e.g. a `String`, an integer, an `Option` or a tuple of them, or derive `Hash` (with `PartialEq` and `Eq`) on your own key type"
)]
pub trait EventKeyHash {
    /// The key's 64-bit hash (`DefaultHasher`, stable within one process).
    fn event_key_hash(&self) -> u64;
}

impl<K: Hash + ?Sized> EventKeyHash for K {
    fn event_key_hash(&self) -> u64 {
        let mut hasher = std::hash::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}
