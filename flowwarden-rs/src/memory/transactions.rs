//! Transactions of the in-memory backend, for `transactional = true` streams: a handler's
//! writes to the backend's collections are held in a [`MemoryTransaction`] and applied at
//! commit, under the backend's one lock, together with the stream's checkpoint, all or nothing.
//!
//! What it models: atomic visibility of the writes and the checkpoint, the checkpoint's epoch
//! fence inside the commit, and injected commit failures ([`crate::Faults::fail_next_commits`]).
//! What it does not: reads inside the transaction (a handler reads committed data through
//! [`crate::MemoryCollection`]; its own pending writes are not visible to it), write conflicts
//! between concurrent transactions, a size limit, and the lifetime limit (the engine enforces
//! [`MemoryTransactions::lifetime_limit`] on the handler itself).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bson::Document;
use tracing::debug;

use super::collection::{with_id, Coll};
use super::{MemoryBackend, MemoryError, State};
use crate::handler_error::HandlerError;
use crate::matcher::update::{is_operator_update, validate_replacement};
use crate::matcher::Filter;
use crate::port::codec::encode_checkpoint;
use crate::port::{
    Checkpoint, CheckpointStore, HandleType, StreamTransaction, TransactionError,
    TransactionErrorKind, TransactionHandle, TransactionHandleType, TransactionStore,
    DEFAULT_TRANSACTION_LIFETIME,
};

/// One write a transaction applies at commit.
#[derive(Debug, Clone)]
enum Write {
    Insert {
        coll: String,
        doc: Document,
    },
    Update {
        coll: String,
        filter: Filter,
        update: Document,
        upsert: bool,
    },
    Delete {
        coll: String,
        filter: Filter,
    },
}

#[derive(Debug)]
enum Phase {
    Open(Vec<Write>),
    Ended(&'static str),
}

/// What a handler of a `transactional = true` stream on the in-memory backend writes through:
/// inserts, updates and deletes on the backend's collections (in its default database) that
/// become visible together with the stream's checkpoint when the handler succeeds, and not at
/// all when it fails, panics or the process stops first. Cheap to clone.
///
/// ```
/// use flowwarden::{change_stream, ChangeContext, HandlerError, MemoryTransaction};
///
/// #[derive(Default)]
/// struct Totals;
///
/// #[change_stream(name = "totals", collection = "orders", transactional = true)]
/// impl Totals {
///     #[on_insert]
///     async fn created(&self, ctx: &ChangeContext<bson::Document>, tx: &MemoryTransaction) -> Result<(), HandlerError> {
///         let id = ctx.document_key().and_then(|k| k.get("_id")).cloned();
///         tx.upsert_one("totals", bson::doc! {"_id": "orders"}, bson::doc! {"$inc": {"n": 1}})?;
///         tx.insert_one("seen", bson::doc! {"order": id})?;
///         Ok(())
///     }
/// }
/// ```
#[derive(Clone)]
pub struct MemoryTransaction {
    inner: Arc<Inner>,
}

struct Inner {
    phase: Mutex<Phase>,
}

impl std::fmt::Debug for MemoryTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTransaction")
            .field("pending_writes", &self.pending_writes())
            .finish()
    }
}

impl MemoryTransaction {
    fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                phase: Mutex::new(Phase::Open(Vec::new())),
            }),
        }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        match self.inner.phase.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn push(&self, write: Write) -> Result<(), MemoryError> {
        match &mut *self.phase() {
            Phase::Open(writes) => {
                writes.push(write);
                Ok(())
            }
            Phase::Ended(how) => Err(MemoryError::TransactionEnded(how)),
        }
    }

    /// Inserts `doc` into `collection` at commit (an `_id` is added when missing). A taken
    /// `_id` fails the commit: nothing of the transaction is applied.
    pub fn insert_one(&self, collection: &str, doc: Document) -> Result<(), MemoryError> {
        self.push(Write::Insert {
            coll: collection.to_owned(),
            doc: with_id(doc),
        })
    }

    /// Applies an operator update (or a replacement) to the first document of `collection`
    /// matching `filter`, at commit.
    pub fn update_one(
        &self,
        collection: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), MemoryError> {
        self.update(collection, filter, update, false)
    }

    /// Like [`MemoryTransaction::update_one`], inserting when nothing matches.
    pub fn upsert_one(
        &self,
        collection: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), MemoryError> {
        self.update(collection, filter, update, true)
    }

    fn update(
        &self,
        collection: &str,
        filter: Document,
        update: Document,
        upsert: bool,
    ) -> Result<(), MemoryError> {
        let filter = Filter::parse(&filter)?;
        if !is_operator_update(&update) {
            validate_replacement(&update)?;
        }
        self.push(Write::Update {
            coll: collection.to_owned(),
            filter,
            update,
            upsert,
        })
    }

    /// Deletes the first document of `collection` matching `filter`, at commit.
    pub fn delete_one(&self, collection: &str, filter: Document) -> Result<(), MemoryError> {
        let filter = Filter::parse(&filter)?;
        self.push(Write::Delete {
            coll: collection.to_owned(),
            filter,
        })
    }

    /// Writes held for the commit (0 once the transaction ended).
    pub fn pending_writes(&self) -> usize {
        match &*self.phase() {
            Phase::Open(w) => w.len(),
            Phase::Ended(_) => 0,
        }
    }

    /// Ends the transaction, returning its writes (none when it had ended already).
    fn end(&self, how: &'static str) -> Vec<Write> {
        let mut phase = self.phase();
        match &mut *phase {
            Phase::Open(writes) => {
                let writes = std::mem::take(writes);
                *phase = Phase::Ended(how);
                writes
            }
            Phase::Ended(_) => Vec::new(),
        }
    }
}

impl TransactionHandleType for MemoryTransaction {}

/// The transaction store of a [`MemoryBackend`] (in its [`crate::Backend`] by default).
#[derive(Clone)]
pub struct MemoryTransactions {
    backend: MemoryBackend,
    lifetime: Duration,
}

impl MemoryTransactions {
    /// Transactions on `backend`, with the default lifetime limit.
    pub fn new(backend: MemoryBackend) -> Self {
        Self {
            backend,
            lifetime: DEFAULT_TRANSACTION_LIFETIME,
        }
    }

    /// Changes the lifetime limit: a handler attempt of a transactional stream that runs
    /// longer fails (see `docs/exactly-once.md`).
    pub fn with_lifetime_limit(mut self, limit: Duration) -> Self {
        self.lifetime = limit;
        self
    }
}

#[async_trait]
impl TransactionStore for MemoryTransactions {
    async fn begin(&self, key: &str) -> Result<Box<dyn StreamTransaction>, TransactionError> {
        Ok(Box::new(Open {
            backend: self.backend.clone(),
            key: key.to_owned(),
            handle: MemoryTransaction::new(),
        }))
    }

    fn checkpoints(&self) -> Arc<dyn CheckpointStore> {
        Arc::new(self.backend.clone())
    }

    fn handle_type(&self) -> HandleType {
        HandleType::of::<MemoryTransaction>()
    }

    fn lifetime_limit(&self) -> Duration {
        self.lifetime
    }

    fn describe(&self) -> String {
        "in-memory transactions".to_owned()
    }
}

/// One open transaction of the engine.
struct Open {
    backend: MemoryBackend,
    key: String,
    handle: MemoryTransaction,
}

#[async_trait]
impl StreamTransaction for Open {
    fn handle(&self) -> TransactionHandle {
        Arc::new(self.handle.clone())
    }

    fn is_transient(&self, _error: &HandlerError) -> bool {
        // Nothing inside a handler's in-memory transaction can conflict.
        false
    }

    async fn commit(
        self: Box<Self>,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<(), TransactionError> {
        let writes = self.handle.end("committed");
        let wall = self.backend.wall_time();
        let result = {
            let mut st = self.backend.lock();
            match st.faults.commit_fails() {
                Some(TransactionErrorKind::CommitUnknown) => st
                    .commit_locked(&writes, checkpoint, wall)
                    .and(Err(TransactionError::new(
                        TransactionErrorKind::CommitUnknown,
                        "the commit's reply was lost after it applied (injected fault)",
                    ))),
                Some(kind) => Err(TransactionError::new(
                    kind,
                    "the commit failed; nothing was applied (injected fault)",
                )),
                None => st.commit_locked(&writes, checkpoint, wall),
            }
        };
        self.backend.notify_appended();
        debug!(key = %self.key, writes = writes.len(), ok = result.is_ok(), "in-memory transaction commit");
        result
    }

    async fn abort(self: Box<Self>) {
        self.handle.end("aborted");
    }
}

impl State {
    /// Checks the checkpoint's fence, applies every write and stores the checkpoint; on any
    /// failure nothing stays applied.
    fn commit_locked(
        &mut self,
        writes: &[Write],
        checkpoint: Option<&Checkpoint>,
        wall: bson::DateTime,
    ) -> Result<(), TransactionError> {
        if let Some(c) = checkpoint {
            if let Some(epoch) = c.epoch {
                self.check_checkpoint_epoch(&c.stream, epoch)?;
                self.check_fence(&c.stream, c.owner.as_deref(), Some(epoch))?;
            }
        }
        let db = self.default_database.clone();
        let undo = Undo::take(self, &db, writes);
        for w in writes {
            let applied = match w {
                Write::Insert { coll, doc } => {
                    self.insert_doc(&db, coll, doc.clone(), wall).map(|_| ())
                }
                Write::Update {
                    coll,
                    filter,
                    update,
                    upsert,
                } => self
                    .update_doc(&db, coll, filter, update, *upsert, wall)
                    .map(|_| ()),
                Write::Delete { coll, filter } => {
                    self.delete_doc(&db, coll, filter, wall).map(|_| ())
                }
            };
            if let Err(e) = applied {
                undo.restore(self);
                return Err(TransactionError::new(
                    TransactionErrorKind::Rejected,
                    format!("a write of the transaction failed, so none was applied: {e}"),
                ));
            }
        }
        undo.finish(self);
        if let Some(c) = checkpoint {
            self.checkpoints
                .insert(c.stream.clone(), encode_checkpoint(c));
        }
        Ok(())
    }
}

/// What a commit needs to take back a partly applied transaction: the touched collections as
/// they were and the oplog's length (retention is suspended until the commit ends, so no entry
/// is dropped meanwhile).
struct Undo {
    collections: Vec<((String, String), Option<Coll>)>,
    oplog_len: usize,
    next_seq: u64,
    retention: usize,
}

impl Undo {
    fn take(st: &mut State, db: &str, writes: &[Write]) -> Self {
        let mut collections: Vec<((String, String), Option<Coll>)> = Vec::new();
        for w in writes {
            let coll = match w {
                Write::Insert { coll, .. }
                | Write::Update { coll, .. }
                | Write::Delete { coll, .. } => coll,
            };
            let ns = (db.to_owned(), coll.clone());
            if !collections.iter().any(|(n, _)| *n == ns) {
                let before = st.collections.get(&ns).cloned();
                collections.push((ns, before));
            }
        }
        let undo = Self {
            collections,
            oplog_len: st.oplog.len(),
            next_seq: st.next_seq,
            retention: st.retention,
        };
        st.retention = usize::MAX;
        undo
    }

    fn restore(self, st: &mut State) {
        for (ns, before) in self.collections {
            match before {
                Some(c) => {
                    st.collections.insert(ns, c);
                }
                None => {
                    st.collections.remove(&ns);
                }
            }
        }
        st.oplog.truncate(self.oplog_len);
        st.next_seq = self.next_seq;
        st.retention = self.retention;
    }

    fn finish(self, st: &mut State) {
        st.retention = self.retention;
        st.enforce_retention();
    }
}
