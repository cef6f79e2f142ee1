//! Leases for `SingleLeader` streams: one holder per stream, with a fencing epoch that grows on
//! every acquisition, judged by the store's clock (never the client's).

use std::time::Duration;

use async_trait::async_trait;
use bson::DateTime;

use crate::store_error::{StoreError, StoreErrorKind};

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

/// This process's identity among the instances of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceId {
    id: String,
    configured: bool,
}

impl InstanceId {
    /// A configured identity.
    pub fn configured(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            configured: true,
        }
    }

    /// `FLOWWARDEN_INSTANCE_ID` when set, else host name, process id and a random suffix (two
    /// processes on one host never share it).
    pub fn from_env() -> Self {
        match std::env::var("FLOWWARDEN_INSTANCE_ID") {
            Ok(id) if !id.trim().is_empty() => Self::configured(id.trim()),
            _ => Self::generated(),
        }
    }

    /// A generated identity: `host-pid-suffix`.
    pub fn generated() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "host".into());
        // RandomState is seeded randomly per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let suffix = h.finish() & 0xFF_FFFF;
        Self {
            id: format!("{host}-{}-{suffix:06x}", std::process::id()),
            configured: false,
        }
    }

    /// The identity.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// Whether it was configured (stable across restarts) rather than generated.
    pub fn is_configured(&self) -> bool {
        self.configured
    }
}

impl std::fmt::Display for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_identities_differ_and_are_not_configured() {
        let a = InstanceId::generated();
        let b = InstanceId::generated();
        assert_ne!(a, b, "random suffix");
        assert!(!a.is_configured());
        assert!(a.as_str().contains(&std::process::id().to_string()));
        assert!(InstanceId::configured("pod-1").is_configured());
    }
}
