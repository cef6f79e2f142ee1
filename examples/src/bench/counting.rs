//! A checkpoint store that counts the writes reaching it, and can play dead.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use flowwarden::port::{Checkpoint, CheckpointStore, Fence, StoreError};

/// Wraps a checkpoint store: counts every `save` that reaches it, and once
/// [`freeze`](Self::freeze)d, accepts writes without storing them — the stored checkpoint
/// stays what it was at the freeze, as after a process crash, while the runtime shuts down
/// normally.
#[derive(Clone)]
pub struct CountingCheckpoints {
    inner: Arc<dyn CheckpointStore>,
    writes: Arc<AtomicU64>,
    frozen: Arc<AtomicBool>,
}

impl CountingCheckpoints {
    /// Counts the writes to `inner`.
    pub fn new(inner: Arc<dyn CheckpointStore>) -> Self {
        CountingCheckpoints {
            inner,
            writes: Arc::new(AtomicU64::new(0)),
            frozen: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The writes counted so far (frozen ones included).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// From now on, writes are counted and dropped.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// The wrapped store.
    pub fn inner(&self) -> Arc<dyn CheckpointStore> {
        self.inner.clone()
    }
}

#[async_trait]
impl CheckpointStore for CountingCheckpoints {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load(stream).await
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if self.frozen.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.save(checkpoint).await
    }

    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError> {
        self.inner.claim(key, fence).await
    }
}
