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
#![warn(unreachable_pub)]

#[allow(unused_extern_crates)]
extern crate self as flowwarden;

#[cfg(feature = "admin")]
pub mod admin;
mod backend;
mod bson_order;
mod context;
#[cfg(feature = "dedup")]
pub mod dedup;
mod definition;
mod engine;
mod event;
mod handler;
mod handler_error;
#[cfg(feature = "matcher")]
pub mod matcher;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "nats")]
pub mod nats;
pub mod port;
#[cfg(feature = "redis")]
pub mod redis;
mod registry;
mod runtime;
mod status;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use backend::Backend;
pub use context::{ChangeContext, DecodeError, EventId};
pub use definition::{
    CheckpointConfig, ConcurrencyConfig, Deployment, FullDocument, FullDocumentBeforeChange,
    LeaseConfig, OnHistoryLost, RestartConfig, ResumeStrategy, RetryConfig, SourceLocation,
    StartPosition, StreamDefinition,
};
#[cfg(feature = "test-util")]
pub use engine::TransactionStep;
pub use engine::{AnyStream, LagConfig};
pub use event::{
    ChangeEvent, EventParseError, Namespace, OperationType, ResumeToken, SplitEvent,
    UpdateDescription,
};
pub use handler::{CollectionName, HandlerFuture, StreamHandler};
pub use handler_error::{ErrorAction, HandlerError, HandlerErrorKind, IntoHandlerResult};
#[cfg(all(feature = "memory", feature = "test-util"))]
pub use memory::Faults;
#[cfg(feature = "memory")]
pub use memory::{
    MemoryBackend, MemoryCollection, MemoryError, MemoryTransaction, MemoryTransactions,
    UpdateOutcome,
};
pub use runtime::{
    builder, run, Builder, ControlError, DeadLetterError, DeadLetters, InstanceId, RunError,
    Runtime, RuntimeHandle, StartupError,
};
pub use status::{Halt, HaltReason, LagStatus, StreamCounters, StreamState, StreamStatus};

#[doc(inline)]
pub use flowwarden_rs_macros::{
    change_stream, checkpoint, filter, key, on_change, on_delete, on_error, on_insert, on_replace,
    on_update, pipeline, restart, retry,
};
