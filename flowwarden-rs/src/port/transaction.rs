//! Transactions that commit a handler's writes together with the stream's checkpoint, for
//! streams declared `transactional = true` (exactly-once effects; see `docs/exactly-once.md`).
//!
//! The runtime never names a database driver: a backend hands each transaction's handle to the
//! handler as an opaque [`TransactionHandle`], and the code `#[change_stream]` generates turns
//! it back into the backend's own type (`flowwarden_rs_mongo::Transaction`,
//! `flowwarden::memory::MemoryTransaction`) by downcasting. The engine only begins, commits
//! (with the checkpoint) and aborts.

use std::any::{Any, TypeId};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::checkpoint::{Checkpoint, CheckpointStore};
use crate::handler_error::HandlerError;

/// The lifetime limit a transaction store assumes unless configured otherwise: 60 s, MongoDB's
/// default `transactionLifetimeLimitSeconds`.
pub const DEFAULT_TRANSACTION_LIFETIME: Duration = Duration::from_secs(60);

/// The handle of one open transaction as the runtime carries it to a handler: the backend's own
/// handle type, erased. Handlers receive it typed (see [`TransactionStore::handle_type`]).
pub type TransactionHandle = Arc<dyn Any + Send + Sync>;

/// The Rust type of the handle a backend gives handlers, for startup checks and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleType {
    /// Its `TypeId`.
    pub id: TypeId,
    /// Its name, as `std::any::type_name` gives it.
    pub name: &'static str,
}

impl HandleType {
    /// The handle type `T`.
    pub fn of<T: Any>() -> Self {
        Self {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }
}

/// A type a backend hands its transactional handlers (`flowwarden_rs_mongo::Transaction`,
/// [`crate::MemoryTransaction`]): the bound `#[change_stream]` checks on a handler's
/// `&Transaction` parameter. A backend implements it for its handle type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the transaction handle of a backend",
    label = "not a transaction handle",
    note = "take `&flowwarden_rs_mongo::Transaction` on MongoDB, or `&flowwarden::MemoryTransaction` on the in-memory backend"
)]
pub trait TransactionHandleType: Any + Clone + Send + Sync {}

/// Begins transactions whose commit also writes the stream's checkpoint.
///
/// A backend that offers one makes `transactional = true` streams possible on it. The
/// checkpoint a commit writes goes to [`TransactionStore::checkpoints`], which a transactional
/// stream then uses for every load and save, so its checkpoint and its effects live in one
/// database.
#[async_trait]
pub trait TransactionStore: Send + Sync + 'static {
    /// Begins a transaction for the stream whose checkpoint is stored under `key`.
    async fn begin(&self, key: &str) -> Result<Box<dyn StreamTransaction>, TransactionError>;

    /// The checkpoint store the commits write to.
    fn checkpoints(&self) -> Arc<dyn CheckpointStore>;

    /// The type of the handle handlers receive.
    fn handle_type(&self) -> HandleType;

    /// How long a transaction may stay open before the database aborts it (MongoDB's
    /// `transactionLifetimeLimitSeconds`, 60 s by default): a handler attempt that takes
    /// longer fails instead of committing into an aborted transaction.
    fn lifetime_limit(&self) -> Duration;

    /// A short description for logs and errors.
    fn describe(&self) -> String;
}

/// One open transaction. Dropped without [`StreamTransaction::commit`] or
/// [`StreamTransaction::abort`], it commits nothing.
#[async_trait]
pub trait StreamTransaction: Send {
    /// The handle to give the handler for this attempt.
    fn handle(&self) -> TransactionHandle;

    /// Whether a handler failure was caused by an error after which the whole transaction may
    /// succeed if run again (MongoDB's `TransientTransactionError` label: a write conflict, a
    /// transaction the server aborted). The engine then runs the handler again in a new
    /// transaction, without counting a failed attempt.
    fn is_transient(&self, error: &HandlerError) -> bool;

    /// Writes `checkpoint` (when given) inside the transaction, fenced by its epoch like
    /// [`CheckpointStore::save`], and commits: the handler's writes and the checkpoint become
    /// visible together or not at all. An unknown commit result is retried here (the commit
    /// only, never the handler) before it is reported as
    /// [`TransactionErrorKind::CommitUnknown`].
    async fn commit(
        self: Box<Self>,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<(), TransactionError>;

    /// Aborts the transaction: nothing of it is applied. Failures are logged, not returned
    /// (the database aborts an abandoned transaction by itself).
    async fn abort(self: Box<Self>);
}

/// How the engine treats a transaction error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionErrorKind {
    /// Nothing was committed and the whole transaction may succeed if run again, handler
    /// included (`TransientTransactionError`).
    Transient,
    /// The commit was sent but whether it applied is unknown, even after retrying it. Neither
    /// running the handler again nor moving on is safe: the stream halts, and on restart the
    /// stored checkpoint (committed with the effects, or not at all) tells which it was.
    CommitUnknown,
    /// The checkpoint inside the transaction was fenced: another instance took over the
    /// stream. Nothing was committed.
    Fenced,
    /// The transaction cannot commit as the handler wrote it (too large, for example):
    /// running it again would fail the same way. Nothing was committed.
    Rejected,
    /// The database could not be reached to begin or run the transaction. Nothing was
    /// committed.
    Unavailable,
}

/// An error of a transaction.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("transaction {kind:?}: {message}")]
pub struct TransactionError {
    /// How the engine treats it.
    pub kind: TransactionErrorKind,
    /// What happened.
    pub message: String,
}

/// A checkpoint write refused inside a transaction: fenced stays fenced; anything else means
/// the store could not be used now.
impl From<super::store_error::StoreError> for TransactionError {
    fn from(e: super::store_error::StoreError) -> Self {
        let kind = if e.kind == super::store_error::StoreErrorKind::Fenced {
            TransactionErrorKind::Fenced
        } else {
            TransactionErrorKind::Unavailable
        };
        Self::new(kind, e.message)
    }
}

impl TransactionError {
    /// A new error.
    pub fn new(kind: TransactionErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}
