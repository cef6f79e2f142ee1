//! The lease store of the in-memory backend, and the fencing checks its other stores apply.
//! Expiry is judged by the backend's clock (Tokio's, virtual under `tokio::time::pause`).

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{MemoryBackend, State};
use crate::port::{check_fence, Lease, LeaseStore};
use crate::port::{StoreError, StoreErrorKind};

#[derive(Debug, Clone)]
pub(crate) struct LeaseRecord {
    owner: String,
    epoch: i64,
    expires: Instant,
}

impl MemoryBackend {
    fn lease_of(&self, stream: &str, r: &LeaseRecord) -> Lease {
        let now = Instant::now();
        let remaining = r.expires.saturating_duration_since(now).as_millis() as i64;
        let wall = self.wall_time().timestamp_millis();
        Lease {
            stream: stream.to_owned(),
            owner: r.owner.clone(),
            epoch: r.epoch,
            expires_at: bson::DateTime::from_millis(wall + remaining),
        }
    }
}

impl State {
    /// Rejects a write carrying `epoch` for `stream` unless it is the stream's current lease
    /// epoch: a deposed leader can never write.
    pub(crate) fn check_fence(
        &self,
        stream: &str,
        owner: Option<&str>,
        epoch: Option<i64>,
    ) -> Result<(), StoreError> {
        let Some(epoch) = epoch else { return Ok(()) };
        let current = self.leases.get(stream).map(|l| (l.owner.as_str(), l.epoch));
        check_fence(stream, current, owner, epoch)
    }

    /// Rejects a write with `epoch` when the stored checkpoint of `key` was claimed or written
    /// with a newer one.
    pub(crate) fn check_checkpoint_epoch(&self, key: &str, epoch: i64) -> Result<(), StoreError> {
        let stored = self
            .checkpoints
            .get(key)
            .and_then(|d| d.get_i64("epoch").ok());
        match stored {
            Some(s) if s > epoch => Err(StoreError::new(
                StoreErrorKind::Fenced,
                format!("checkpoint of '{key}' was claimed or written with epoch {s} > {epoch}"),
            )),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl LeaseStore for MemoryBackend {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let now = Instant::now();
        let mut st = self.lock();
        let epoch = match st.leases.get(stream) {
            Some(l) if l.expires > now && l.owner != owner => return Ok(None),
            Some(l) => l.epoch + 1,
            None => 1,
        };
        let rec = LeaseRecord {
            owner: owner.to_owned(),
            epoch,
            expires: now + ttl,
        };
        st.leases.insert(stream.to_owned(), rec.clone());
        drop(st);
        Ok(Some(self.lease_of(stream, &rec)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let now = Instant::now();
        let mut st = self.lock();
        if st.faults.renewal_frozen(&lease.owner) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "lease renewal failed (injected fault)",
            ));
        }
        match st.leases.get_mut(&lease.stream) {
            Some(l) if l.epoch == lease.epoch && l.owner == lease.owner => {
                l.expires = now + ttl;
                let rec = l.clone();
                drop(st);
                Ok(Some(self.lease_of(&lease.stream, &rec)))
            }
            _ => Ok(None),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut st = self.lock();
        if let Some(l) = st.leases.get_mut(&lease.stream) {
            if l.epoch == lease.epoch && l.owner == lease.owner {
                // Keep the epoch so the next holder's is higher; just make it free now.
                l.expires = Instant::now();
            }
        }
        Ok(())
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        let st = self.lock();
        let rec = st.leases.get(stream).cloned();
        drop(st);
        Ok(rec.map(|r| self.lease_of(stream, &r)))
    }
}
