//! The recording transaction store of a transactional stream: the in-memory backend's
//! transactions, whose commits write the checkpoint without going through the checkpoint
//! store. Each commit is recorded as a checkpoint write (accepted or rejected, with its epoch
//! and owner and the lease at that instant), exactly as the checkpoint wrapper records a plain
//! write, and settles the event whose handler succeeded in it only when the store applied it.
//! A commit takes the schedule's virtual time both ways (request, reply), and a
//! `CrashInCommit` trap can hold it before or after it applies.

use flowwarden::port::{HandleType, StreamTransaction, TransactionStore};
use flowwarden::MemoryTransactions;

use super::*;

/// The in-memory transactions of one runtime; `checkpoints` is its recording checkpoint store
/// (where a transactional stream loads and saves its plain checkpoint writes).
pub(crate) struct RecTransactions {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
    pub(crate) inner: MemoryTransactions,
    pub(crate) checkpoints: Arc<RecCheckpoints>,
}

#[async_trait]
impl TransactionStore for RecTransactions {
    async fn begin(&self, key: &str) -> Result<Box<dyn StreamTransaction>, TransactionError> {
        let inner = self.inner.begin(key).await?;
        self.world.lock().on_transaction_begun(self.inc);
        Ok(Box::new(RecTransaction {
            inner,
            rec: Recorder {
                world: self.world.clone(),
                memory: self.memory.clone(),
                inc: self.inc,
            },
        }))
    }

    fn checkpoints(&self) -> Arc<dyn CheckpointStore> {
        self.checkpoints.clone()
    }

    fn handle_type(&self) -> HandleType {
        self.inner.handle_type()
    }

    fn lifetime_limit(&self) -> Duration {
        self.inner.lifetime_limit()
    }

    fn describe(&self) -> String {
        "simulated in-memory transactions".into()
    }
}

/// One open transaction, recorded.
struct RecTransaction {
    inner: Box<dyn StreamTransaction>,
    rec: Recorder,
}

/// What a transaction's recording needs: the world, the backend, its runtime.
struct Recorder {
    world: Arc<World>,
    memory: MemoryBackend,
    inc: u32,
}

impl Recorder {
    /// Stops here for good (until the harness crashes this runtime) when the armed trap is
    /// for this side of the commit.
    async fn trap(&self, applied: bool) {
        let hit = {
            let mut w = self.world.lock();
            let notify = match &mut w.txn.trap {
                Some(t) if t.applied == applied && t.hit.is_none() => {
                    t.hit = Some(self.inc);
                    Some(t.notify.clone())
                }
                _ => None,
            };
            if notify.is_some() {
                let tag = w.tag(self.inc);
                w.log(format!(
                    "{tag}a commit is held {} (trap)",
                    if applied {
                        "after it applied"
                    } else {
                        "before it reaches the store"
                    }
                ));
            }
            notify
        };
        if let Some(notify) = hit {
            notify.notify_one();
            std::future::pending::<()>().await;
        }
    }

    /// The effect counter of the event whose handler succeeded in this runtime's transaction.
    fn effect(&self) -> Option<i64> {
        let id = self.world.lock().pending_effect(self.inc)?;
        let doc = self
            .memory
            .collection(EFFECTS)
            .find_one(bson::doc! {"_id": id})
            .ok()
            .flatten();
        Some(doc.as_ref().map_or(0, counter))
    }
}

#[async_trait]
impl StreamTransaction for RecTransaction {
    fn handle(&self) -> flowwarden::port::TransactionHandle {
        self.inner.handle()
    }

    fn is_transient(&self, error: &HandlerError) -> bool {
        self.inner.is_transient(error)
    }

    async fn commit(
        self: Box<Self>,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<(), TransactionError> {
        let RecTransaction { inner, rec } = *self;
        let (request, reply) = rec
            .world
            .lock()
            .settings
            .transactional
            .as_ref()
            .map_or((0, 0), |t| (t.commit_request_ms, t.commit_reply_ms));
        if request > 0 {
            tokio::time::sleep(Duration::from_millis(request)).await;
        }
        rec.trap(false).await;
        // The in-memory commit applies (or not) without yielding: nothing runs in between.
        let head = rec.memory.oplog_head();
        let result = inner.commit(checkpoint).await;
        let applied = rec.memory.oplog_head() != head;
        let effect = if applied { rec.effect() } else { None };
        let current = current_lease(&rec.memory).await;
        rec.world.lock().on_commit(
            rec.inc,
            checkpoint,
            &result,
            applied,
            effect,
            current.as_ref(),
        );
        rec.trap(true).await;
        if reply > 0 {
            tokio::time::sleep(Duration::from_millis(reply)).await;
        }
        rec.world.lock().on_commit_answered(rec.inc);
        result
    }

    async fn abort(self: Box<Self>) {
        self.rec.world.lock().on_transaction_aborted(self.rec.inc);
        self.inner.abort().await;
    }
}
