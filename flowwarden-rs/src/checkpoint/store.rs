//! The checkpoint store trait.

use async_trait::async_trait;

use super::Checkpoint;
use crate::store_error::StoreError;

/// Where checkpoints live (`_fw_checkpoints` on MongoDB).
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// The stored checkpoint of `stream`, if any. A stored document that does not parse is a
    /// [`crate::StoreErrorKind::Corrupt`] error naming the stream and the field.
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Writes `checkpoint` (one conditional write on real stores).
    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;
}
