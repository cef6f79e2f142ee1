//! The lease store on Redis: one hash per stream, `<prefix>{<stream>}:lease` with `owner`,
//! `epoch` and `expiresAt` (milliseconds, the server's clock). Taken, renewed and released by
//! one script each; expiry is judged inside the script against the server's `TIME`. The hash
//! has no TTL and is never deleted, so the epoch keeps growing across owners, expiries and
//! releases.

use std::time::Duration;

use async_trait::async_trait;
use bson::DateTime;
use tracing::debug;

use super::connection::RedisConnection;
use super::scripts::{Reply, ACQUIRE_SCRIPT, CURRENT_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT};
use crate::port::{Lease, LeaseStore, StoreError, StoreErrorKind};

/// Leases of `SingleLeader` streams in Redis (see the module docs of [`crate::redis`]).
#[derive(Debug, Clone)]
pub struct RedisLeaseStore {
    redis: RedisConnection,
}

impl RedisLeaseStore {
    /// A lease store on `redis` (the connection is shared, not copied).
    pub fn new(redis: &RedisConnection) -> Self {
        Self {
            redis: redis.clone(),
        }
    }

    /// The Redis key of the lease of `stream` (`<prefix>{<stream>}:lease`), for operators.
    pub fn key(&self, stream: &str) -> String {
        self.redis.lease_key(stream)
    }

    async fn run(
        &self,
        what: &str,
        script: &::redis::Script,
        stream: &str,
        args: &[&[u8]],
    ) -> Result<Reply, StoreError> {
        let key = self.redis.lease_key(stream);
        let values = self.redis.eval(what, script, &[&key], args).await?;
        let reply = Reply::parse(what, values)?;
        if reply.status == "corrupt_lease" {
            return Err(corrupt_lease(stream, &key, &reply.text(0)?));
        }
        Ok(reply)
    }
}

/// The lease's length in milliseconds, for the scripts.
pub(crate) fn ttl_ms(ttl: Duration) -> String {
    u64::try_from(ttl.as_millis())
        .unwrap_or(u64::MAX)
        .to_string()
}

/// A `{status, owner, epoch, expiresAt}` reply as a lease of `stream`.
fn lease_of(stream: &str, reply: &Reply) -> Result<Lease, StoreError> {
    Ok(Lease {
        stream: stream.to_owned(),
        owner: reply.text(0)?,
        epoch: reply.int(1)?,
        expires_at: DateTime::from_millis(reply.int(2)?),
    })
}

pub(crate) fn corrupt_lease(stream: &str, key: &str, field: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        format!("lease of stream '{stream}' at Redis key '{key}': field `{field}` is missing or malformed"),
    )
}

#[async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let what = format!("taking the lease of stream '{stream}'");
        let ttl = ttl_ms(ttl);
        let reply = self
            .run(
                &what,
                &ACQUIRE_SCRIPT,
                stream,
                &[owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        match reply.status.as_str() {
            "ok" => {
                let lease = lease_of(stream, &reply)?;
                debug!(stream, owner, epoch = lease.epoch, "lease taken");
                Ok(Some(lease))
            }
            "held" => {
                debug!(stream, owner, holder = %reply.text(0)?, "lease held by another owner");
                Ok(None)
            }
            _ => Err(reply.unexpected()),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let what = format!("renewing the lease of stream '{}'", lease.stream);
        let epoch = lease.epoch.to_string();
        let ttl = ttl_ms(ttl);
        let reply = self
            .run(
                &what,
                &RENEW_SCRIPT,
                &lease.stream,
                &[lease.owner.as_bytes(), epoch.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        match reply.status.as_str() {
            "ok" => lease_of(&lease.stream, &reply).map(Some),
            "lost" => {
                debug!(stream = %lease.stream, owner = %lease.owner, epoch = lease.epoch, "lease lost");
                Ok(None)
            }
            _ => Err(reply.unexpected()),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let what = format!("releasing the lease of stream '{}'", lease.stream);
        let epoch = lease.epoch.to_string();
        let reply = self
            .run(
                &what,
                &RELEASE_SCRIPT,
                &lease.stream,
                &[lease.owner.as_bytes(), epoch.as_bytes()],
            )
            .await?;
        match reply.status.as_str() {
            "ok" | "not_held" => Ok(()),
            _ => Err(reply.unexpected()),
        }
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        let what = format!("reading the lease of stream '{stream}'");
        let reply = self.run(&what, &CURRENT_SCRIPT, stream, &[]).await?;
        match reply.status.as_str() {
            "lease" => lease_of(stream, &reply).map(Some),
            "none" => Ok(None),
            _ => Err(reply.unexpected()),
        }
    }
}
