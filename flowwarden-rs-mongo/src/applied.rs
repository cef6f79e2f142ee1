//! [`MongoApplied`] (feature `dedup`): the events a handler applied, in `_fw_applied`, for
//! `flowwarden::dedup::Idempotency`.

use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, DateTime, Document};
use flowwarden::dedup::AppliedStore;
use flowwarden::port::StoreError;
use mongodb::options::IndexOptions;
use mongodb::{Collection, IndexModel};
use tokio::sync::OnceCell;

use crate::stores::store_error;
use crate::MongoBackend;

/// Collection of the applied-event records.
pub const APPLIED: &str = "_fw_applied";
/// Name of its TTL index (`expiresAt`, `expireAfterSeconds: 0`).
pub const APPLIED_TTL_INDEX: &str = "expiresAt_ttl";

/// Applied events as `{_id: "<stream>:<event id>", expiresAt}` documents in `_fw_applied` of
/// the backend's database. A TTL index removes expired records (MongoDB's TTL monitor runs about
/// once a minute, so lookups also ignore records past `expiresAt`); `expiresAt` is the writer's
/// clock plus the time to live. The index is created on first use.
#[derive(Debug, Clone)]
pub struct MongoApplied {
    collection: Collection<Document>,
    index: std::sync::Arc<OnceCell<()>>,
}

impl MongoApplied {
    /// The store of `backend`'s database.
    pub fn new(backend: &MongoBackend) -> Self {
        Self {
            collection: backend
                .client()
                .database(backend.database())
                .collection(APPLIED),
            index: std::sync::Arc::default(),
        }
    }

    async fn collection(&self) -> Result<&Collection<Document>, StoreError> {
        self.index
            .get_or_try_init(|| async {
                let model = IndexModel::builder()
                    .keys(doc! { "expiresAt": 1 })
                    .options(
                        IndexOptions::builder()
                            .name(APPLIED_TTL_INDEX.to_owned())
                            .expire_after(Duration::ZERO)
                            .build(),
                    )
                    .build();
                self.collection
                    .create_index(model)
                    .await
                    .map(|_| ())
                    .map_err(|e| store_error("creating the TTL index of _fw_applied", &e))
            })
            .await?;
        Ok(&self.collection)
    }
}

#[async_trait]
impl AppliedStore for MongoApplied {
    async fn contains(&self, key: &str) -> Result<bool, StoreError> {
        let found = self
            .collection()
            .await?
            .find_one(doc! { "_id": key, "expiresAt": { "$gt": DateTime::now() } })
            .await
            .map_err(|e| store_error("reading _fw_applied", &e))?;
        Ok(found.is_some())
    }

    async fn record(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let expires =
            DateTime::from_millis(DateTime::now().timestamp_millis().saturating_add(ttl_ms));
        self.collection()
            .await?
            .update_one(
                doc! { "_id": key },
                doc! { "$setOnInsert": { "expiresAt": expires } },
            )
            .upsert(true)
            .await
            .map_err(|e| store_error("writing _fw_applied", &e))?;
        Ok(())
    }
}
