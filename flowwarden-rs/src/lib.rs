//! flowwarden: declared, supervised MongoDB change-stream handlers.
//!
//! Annotate an `impl` block with [`change_stream`] and its companion attributes, call
//! [`run()`], and each stream is validated at startup and supervised: routed by operation type,
//! filtered, retried, dead-lettered, and checkpointed only over settled events — at-least-once,
//! and never a silent gap. See the README and `docs/` for the whole picture.
//!
//! ```no_run
//! use bson::{doc, Document};
//! use flowwarden::{change_stream, checkpoint, retry, ChangeContext, HandlerError};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { status: String }
//!
//! #[derive(Default)]
//! struct OrderStream;
//!
//! #[change_stream(name = "orders", collection = "orders", document = Order,
//!                 full_document = "updateLookup")]
//! #[checkpoint(save_every_n = 5, save_interval_secs = 10)]
//! #[retry(max_attempts = 3, initial_delay_ms = 200)]
//! impl OrderStream {
//!     #[pipeline]
//!     fn pipeline() -> Vec<Document> { vec![doc! { "$match": { "fullDocument.status": "PAID" } }] }
//!
//!     #[on_insert]
//!     async fn created(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
//!         println!("{} paid: {}", ctx.event_id(), order.status);
//!         Ok(())
//!     }
//!
//!     #[on_update] #[on_replace]
//!     async fn changed(&self, _order: Order) -> Result<(), HandlerError> { Ok(()) }
//!
//!     #[on_delete]
//!     fn deleted(&self, ctx: &ChangeContext<Order>) { println!("gone: {:?}", ctx.document_key()) }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), flowwarden::RunError> {
//!     flowwarden::run().await
//! }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

#[allow(unused_extern_crates)]
extern crate self as flowwarden;

pub mod backend;
pub mod checkpoint;
pub mod context;
pub mod dead_letter;
pub mod definition;
pub(crate) mod engine;
pub mod event;
pub mod handler;
pub mod handler_error;
pub mod lease;
#[cfg(feature = "matcher")]
pub mod matcher;
#[cfg(feature = "memory")]
pub mod memory;
pub(crate) mod registry;
pub mod runtime;
pub mod source;
pub mod status;
pub mod store_error;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use backend::Backend;
pub use checkpoint::{is_claim_only, Checkpoint, CheckpointStore, StoredPosition, CLAIMED_AT};
pub use context::{ChangeContext, DecodeError, EventId};
pub use dead_letter::{DeadLetterQuery, DeadLetterRecord, DeadLetterStatus, DeadLetterStore};
pub use definition::{
    CheckpointConfig, Deployment, FullDocument, FullDocumentBeforeChange, LeaseConfig,
    OnHistoryLost, RestartConfig, ResumeStrategy, RetryConfig, StartPosition, StreamDefinition,
};
pub use engine::AnyStream;
pub use event::{ChangeEvent, Namespace, OperationType, ResumeToken, UpdateDescription};
pub use handler::{CollectionName, HandlerFuture, StreamHandler};
pub use handler_error::{ErrorAction, HandlerError, HandlerErrorKind, IntoHandlerResult};
pub use lease::{Fence, InstanceId, Lease, LeaseStore};
#[cfg(feature = "memory")]
pub use memory::MemoryBackend;
pub use runtime::{
    builder, run, Builder, ControlError, DeadLetterError, DeadLetters, RunError, Runtime,
    RuntimeHandle, StartupError,
};
pub use source::{
    ChangeCursor, ChangeSource, SourceError, SourceErrorKind, SourceItem, StartAt, WatchSpec,
};
pub use status::{Halt, HaltReason, StreamCounters, StreamState, StreamStatus};
pub use store_error::{StoreError, StoreErrorKind};

#[doc(inline)]
pub use flowwarden_rs_macros::{
    change_stream, checkpoint, filter, on_change, on_delete, on_error, on_insert, on_replace,
    on_update, pipeline, restart, retry,
};
