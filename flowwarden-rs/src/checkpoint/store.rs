//! The checkpoint store trait.

use async_trait::async_trait;

use super::Checkpoint;
use crate::lease::Fence;
use crate::store_error::StoreError;

/// Where checkpoints live (`_fw_checkpoints` on MongoDB).
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// The stored checkpoint of `stream`, if any. A stored document that does not parse is a
    /// [`crate::StoreErrorKind::Corrupt`] error naming the stream and the field.
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Writes `checkpoint` (one conditional write on real stores). A checkpoint that carries an
    /// epoch is written only while no newer epoch has claimed or written `checkpoint.stream`;
    /// otherwise the write is a [`crate::StoreErrorKind::Fenced`] error.
    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;

    /// Claims the checkpoint of `key` for a leader that has just taken the lease with `fence`,
    /// before it loads the checkpoint: from then on, writes carrying an older epoch are
    /// rejected, so a deposed leader that wakes up can never move the checkpoint behind the new
    /// leader's back. One conditional write; [`crate::StoreErrorKind::Fenced`] when a newer
    /// epoch has claimed it already. A claim alone is no checkpoint: `load` still returns what
    /// was stored before, or `None`.
    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError>;
}
