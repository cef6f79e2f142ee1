//! Leases for `SingleLeader` streams: one holder per stream, with a fencing epoch that grows on
//! every acquisition, judged by the store's clock (never the client's).

use std::time::Duration;

use async_trait::async_trait;
use bson::DateTime;

use super::store_error::{StoreError, StoreErrorKind};

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The stream.
    pub stream: String,
    /// The holder's instance identity.
    pub owner: String,
    /// Fencing epoch: grows by one on every acquisition.
    pub epoch: i64,
    /// When it expires unless renewed, by the store's clock.
    pub expires_at: DateTime,
}

/// The identity and epoch a leader attaches to its writes; stores reject a write whose epoch
/// is no longer the stream's current one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The writer's instance identity.
    pub owner: String,
    /// Its lease epoch.
    pub epoch: i64,
}

/// The fencing rule every store applies: a write of `stream` carrying `epoch` (and, when given,
/// `owner`) is accepted only while it is the epoch (and owner) of the stream's lease now,
/// `current`; otherwise it is a [`StoreErrorKind::Fenced`] error that says who holds it.
pub fn check_fence(
    stream: &str,
    current: Option<(&str, i64)>,
    owner: Option<&str>,
    epoch: i64,
) -> Result<(), StoreError> {
    match current {
        Some((holder, held)) if held == epoch && owner.is_none_or(|o| o == holder) => Ok(()),
        Some((holder, held)) => Err(StoreError::new(
            StoreErrorKind::Fenced,
            format!(
                "stream '{stream}' is now held by '{holder}' with epoch {held}; this write carries epoch {epoch}"
            ),
        )),
        None => Err(StoreError::new(
            StoreErrorKind::Fenced,
            format!("stream '{stream}' has no lease; this write carries epoch {epoch}"),
        )),
    }
}

/// Where leases live (`_fw_locks` on MongoDB).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the lease of `stream` for `owner` when it is free or expired (one conditional
    /// write; the epoch grows by one). `None` when another owner holds a live lease.
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError>;

    /// Extends a held lease; `None` when it was lost (expired and taken, or released).
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError>;

    /// Gives the lease up (only if still held with this epoch).
    async fn release(&self, lease: &Lease) -> Result<(), StoreError>;

    /// The current lease of `stream`, live or not.
    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError>;
}
