//! Transactions for `transactional = true` streams: each handled event runs in one
//! multi-document transaction whose commit writes the handler's writes and the stream's
//! checkpoint (`_fw_checkpoints`, fenced by epoch) together. See `docs/exactly-once.md`.
//!
//! Commit handling follows the driver's Transactions specification: an error labelled
//! `TransientTransactionError` (on a handler's write or on the commit) means nothing was
//! committed and the whole transaction may run again, handler included; an error labelled
//! `UnknownTransactionCommitResult` retries the commit only (never the handler), until the
//! outcome is known or the retry window (120 s, as the drivers' `withTransaction`) is spent.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Document};
use flowwarden::port::codec::encode_checkpoint;
use flowwarden::port::{
    Checkpoint, CheckpointStore, HandleType, StreamTransaction, TransactionError,
    TransactionErrorKind, TransactionHandle, TransactionHandleType, TransactionStore,
};
use flowwarden::HandlerError;
use mongodb::error::{
    Error, ErrorKind, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT,
};
use mongodb::options::{Acknowledgment, ReadConcern, WriteConcern};
use mongodb::{Client, ClientSession, Collection, Database};
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::classify::{ErrorClass, ErrorFacts};
use crate::stores::{code_of, DUPLICATE_KEY};
use crate::{short_error, MongoBackend, CHECKPOINTS};

/// How long an unknown commit result is retried (the commit only) before the stream halts.
const COMMIT_RETRY_WINDOW: Duration = Duration::from_secs(120);

/// Server codes that mean the transaction is too large to commit as written.
const TOO_LARGE_CODES: &[i32] = &[257, 10334, 17419, 17420];

/// 50 MaxTimeMSExpired: labelled `UnknownTransactionCommitResult` on a commit, but retrying
/// would time out again (the drivers do not retry it either).
const MAX_TIME_MS_EXPIRED: i32 = 50;

/// What a handler of a `transactional = true` stream on MongoDB receives: the driver's
/// [`ClientSession`] with a transaction started (snapshot read concern, majority write
/// concern), and the database of the backend. Pass the session to every read and write that
/// belongs to the event; they commit together with the stream's checkpoint when the handler
/// returns `Ok`, and not at all otherwise. Cheap to clone.
///
/// ```no_run
/// use bson::{doc, Document};
/// use flowwarden::{change_stream, ChangeContext, HandlerError};
/// use flowwarden_rs_mongo::Transaction;
///
/// #[derive(Default)]
/// struct OrderTotals;
///
/// #[change_stream(name = "order-totals", collection = "orders", document = Document,
///                 transactional = true)]
/// impl OrderTotals {
///     #[on_insert]
///     async fn created(&self, order: Document, tx: &Transaction) -> Result<(), HandlerError> {
///         let customer = order.get_str("customer").unwrap_or("unknown").to_owned();
///         let totals = tx.collection::<Document>("totals");
///         totals
///             .update_one(doc! {"_id": customer}, doc! {"$inc": {"orders": 1}})
///             .upsert(true)
///             .session(&mut *tx.session().await)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
///
/// Use it only inside the handler: once the handler returns, the transaction is committed or
/// aborted, and operations through the session no longer belong to it.
#[derive(Clone)]
pub struct Transaction {
    inner: Arc<Inner>,
}

struct Inner {
    session: Mutex<ClientSession>,
    database: Database,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("database", &self.inner.database.name())
            .finish()
    }
}

impl TransactionHandleType for Transaction {}

impl Transaction {
    /// The session that carries the transaction: pass `&mut *tx.session().await` to
    /// `.session(..)` of each operation. Held across an `.await`, it keeps other operations of
    /// this handler waiting, so take it per operation.
    pub async fn session(&self) -> MutexGuard<'_, ClientSession> {
        self.inner.session.lock().await
    }

    /// The backend's database (the one holding `_fw_checkpoints`); use
    /// [`Transaction::client`] for another database of the same deployment.
    pub fn database(&self) -> &Database {
        &self.inner.database
    }

    /// A collection of the backend's database.
    pub fn collection<T: Send + Sync>(&self, name: &str) -> Collection<T> {
        self.inner.database.collection(name)
    }

    /// The driver client (the transaction spans every database of the deployment).
    pub fn client(&self) -> &Client {
        self.inner.database.client()
    }
}

#[async_trait]
impl TransactionStore for MongoBackend {
    async fn begin(&self, key: &str) -> Result<Box<dyn StreamTransaction>, TransactionError> {
        let unavailable = |what: &str, e: &Error| {
            TransactionError::new(
                TransactionErrorKind::Unavailable,
                format!("{what} for stream '{key}': {}", short_error(e)),
            )
        };
        let mut session = self
            .client
            .start_session()
            .await
            .map_err(|e| unavailable("starting a session", &e))?;
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).build())
            .await
            .map_err(|e| unavailable("starting a transaction", &e))?;
        Ok(Box::new(Open {
            backend: self.clone(),
            handle: Transaction {
                inner: Arc::new(Inner {
                    session: Mutex::new(session),
                    database: self.client.database(&self.database),
                }),
            },
        }))
    }

    fn checkpoints(&self) -> Arc<dyn CheckpointStore> {
        Arc::new(self.clone())
    }

    fn handle_type(&self) -> HandleType {
        HandleType::of::<Transaction>()
    }

    fn lifetime_limit(&self) -> Duration {
        self.transaction_lifetime
    }

    fn describe(&self) -> String {
        format!("transactions of {}", self.description)
    }
}

/// One open transaction of the engine.
struct Open {
    backend: MongoBackend,
    handle: Transaction,
}

/// Whether `error`, or an error in its source chain, is a driver error labelled `label`.
fn has_label(error: &(dyn std::error::Error + 'static), label: &str) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(driver) = e.downcast_ref::<Error>() {
            if driver.contains_label(label) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

fn too_large(e: &Error) -> bool {
    code_of(e).is_some_and(|c| TOO_LARGE_CODES.contains(&c))
        || matches!(e.kind.as_ref(), ErrorKind::InvalidArgument { message, .. } if message.contains("too large"))
}

impl Open {
    /// Writes the checkpoint inside the transaction: a conditional replace on the stored
    /// epoch, like [`CheckpointStore::save`].
    async fn write_checkpoint(
        &self,
        session: &mut ClientSession,
        checkpoint: &Checkpoint,
    ) -> Result<(), TransactionError> {
        let stream = &checkpoint.stream;
        if let Some(epoch) = checkpoint.epoch {
            self.backend
                .check_fence(stream, checkpoint.owner.as_deref(), epoch)
                .await?;
        }
        let filter = match checkpoint.epoch {
            None => doc! { "_id": stream },
            Some(epoch) => doc! {
                "_id": stream,
                "$or": [ { "epoch": { "$exists": false } }, { "epoch": { "$lte": epoch } } ],
            },
        };
        let coll: Collection<Document> = self
            .backend
            .client
            .database(&self.backend.database)
            .collection(CHECKPOINTS);
        match coll
            .replace_one(filter, encode_checkpoint(checkpoint))
            .upsert(true)
            .session(&mut *session)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if code_of(&e) == Some(DUPLICATE_KEY) && checkpoint.epoch.is_some() => {
                Err(TransactionError::new(
                    TransactionErrorKind::Fenced,
                    format!(
                        "checkpoint of stream '{stream}' is owned with an epoch newer than {}",
                        checkpoint.epoch.unwrap_or_default()
                    ),
                ))
            }
            Err(e) => Err(classify(
                &e,
                &format!("writing the checkpoint of stream '{stream}' in the transaction"),
            )),
        }
    }
}

/// A failed write or commit of a transaction that did not commit.
fn classify(e: &Error, what: &str) -> TransactionError {
    let kind = if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        TransactionErrorKind::Transient
    } else if too_large(e) {
        TransactionErrorKind::Rejected
    } else if matches!(
        ErrorFacts::of(e).class,
        ErrorClass::Network | ErrorClass::ServerSelection | ErrorClass::Dns
    ) {
        TransactionErrorKind::Unavailable
    } else {
        // Without either label the transaction definitely did not commit: running it again is
        // safe (the engine bounds how long).
        TransactionErrorKind::Transient
    };
    TransactionError::new(kind, format!("{what}: {}", short_error(e)))
}

#[async_trait]
impl StreamTransaction for Open {
    fn handle(&self) -> TransactionHandle {
        Arc::new(self.handle.clone())
    }

    fn is_transient(&self, error: &HandlerError) -> bool {
        has_label(error.as_std_error(), TRANSIENT_TRANSACTION_ERROR)
    }

    async fn commit(
        self: Box<Self>,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<(), TransactionError> {
        let mut session = self.handle.inner.session.lock().await;
        if let Some(checkpoint) = checkpoint {
            if let Err(e) = self.write_checkpoint(&mut session, checkpoint).await {
                if let Err(abort) = session.abort_transaction().await {
                    debug!(error = %short_error(&abort), "abort after a failed checkpoint write");
                }
                return Err(e);
            }
        }
        let started = Instant::now();
        loop {
            let e = match session.commit_transaction().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) {
                if code_of(&e) == Some(MAX_TIME_MS_EXPIRED)
                    || started.elapsed() >= COMMIT_RETRY_WINDOW
                {
                    return Err(TransactionError::new(
                        TransactionErrorKind::CommitUnknown,
                        format!(
                            "commitTransaction: {} (retried for {} s)",
                            short_error(&e),
                            started.elapsed().as_secs()
                        ),
                    ));
                }
                warn!(error = %short_error(&e), "the commit's result is unknown; committing again (the commit only)");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return Err(classify(&e, "commitTransaction"));
        }
    }

    async fn abort(self: Box<Self>) {
        let mut session = self.handle.inner.session.lock().await;
        if let Err(e) = session.abort_transaction().await {
            // The server aborts a transaction after a failed operation; the driver then has
            // nothing to abort, or the server forgot it: either way nothing was committed.
            debug!(error = %short_error(&e), "abortTransaction failed; the transaction commits nothing");
        }
    }
}
