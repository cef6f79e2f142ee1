//! [`MemoryApplied`]: applied events recorded in this process's memory.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::AppliedStore;
use crate::port::StoreError;

/// Applied events kept in memory until they expire: for tests and single-process tools (a
/// restart forgets them, so only redeliveries within one process are skipped).
#[derive(Debug, Default)]
pub struct MemoryApplied {
    records: Mutex<HashMap<String, Instant>>,
}

#[async_trait]
impl AppliedStore for MemoryApplied {
    async fn contains(&self, key: &str) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records.retain(|_, expires| *expires > now);
        Ok(records.contains_key(key))
    }

    async fn record(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .entry(key.to_owned())
            .or_insert_with(|| Instant::now() + ttl);
        Ok(())
    }
}
