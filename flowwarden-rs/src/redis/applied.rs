//! [`RedisApplied`] (features `redis` and `dedup`): the events a handler applied, one Redis key
//! each, for [`crate::dedup::Idempotency`].

use std::time::Duration;

use async_trait::async_trait;

use super::RedisConnection;
use crate::dedup::AppliedStore;
use crate::port::StoreError;

/// Applied events as keys `<prefix>applied:<stream>:<event id>`, written with `SET NX PX`:
/// Redis expires each record by its own clock after the time to live.
#[derive(Debug, Clone)]
pub struct RedisApplied {
    redis: RedisConnection,
}

impl RedisApplied {
    /// The store on `redis` (its key prefix applies).
    pub fn new(redis: &RedisConnection) -> Self {
        Self {
            redis: redis.clone(),
        }
    }

    /// The Redis key of the record `key` (for `redis-cli`).
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}applied:{key}", self.redis.prefix())
    }
}

#[async_trait]
impl AppliedStore for RedisApplied {
    async fn contains(&self, key: &str) -> Result<bool, StoreError> {
        let mut cmd = ::redis::cmd("EXISTS");
        cmd.arg(self.redis_key(key));
        let n: i64 = self
            .redis
            .query("reading an applied-event record", &cmd)
            .await?;
        Ok(n > 0)
    }

    async fn record(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(self.redis_key(key))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms);
        // `OK` when written, nil when the record existed: both mean "recorded".
        let _: Option<String> = self
            .redis
            .query("writing an applied-event record", &cmd)
            .await?;
        Ok(())
    }
}
