//! The lease store of `SingleLeader` streams on `_fw_locks`: one document per stream, taken,
//! renewed and released by single conditional writes whose expiry is computed and judged by the
//! **server's** clock (`$$NOW` in an `$expr` filter and in a pipeline-style update), never the
//! client's.

use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Bson, DateTime, Document};
use flowwarden::port::{Lease, LeaseStore, StoreError, StoreErrorKind};
use mongodb::options::ReturnDocument;
use mongodb::Collection;

use crate::stores::{code_of, store_error, DUPLICATE_KEY};
use crate::{MongoBackend, LOCKS};

/// One lease: which instance owns a stream, with which fencing epoch, until when.
///
/// Stored in `_fw_locks` as `{_id: stream, owner, epoch, expiresAt}`. A lease is held only while
/// `expiresAt` is in the future by the server's clock. The document is never deleted (releasing
/// sets `expiresAt` to the server's now): the epoch must keep growing across owners, so there is
/// deliberately **no TTL index** on this collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseDocument {
    /// The stream (`_id`).
    pub stream: String,
    /// The instance holding the lease.
    pub owner: String,
    /// The fencing epoch: increases on every change of owner.
    pub epoch: i64,
    /// When the lease lapses unless renewed.
    pub expires_at: DateTime,
}

impl LeaseDocument {
    /// The stored document.
    pub fn to_document(&self) -> Document {
        doc! {
            "_id": &self.stream,
            "owner": &self.owner,
            "epoch": self.epoch,
            "expiresAt": self.expires_at,
        }
    }

    /// Parses a stored document; a malformed one is `Corrupt`, naming the stream and field.
    pub fn from_document(d: &Document) -> Result<Self, StoreError> {
        let stream = d
            .get_str("_id")
            .map_err(|_| corrupt("?", "_id"))?
            .to_owned();
        let owner = d
            .get_str("owner")
            .map_err(|_| corrupt(&stream, "owner"))?
            .to_owned();
        let epoch = match d.get("epoch") {
            Some(Bson::Int64(e)) => *e,
            Some(Bson::Int32(e)) => i64::from(*e),
            _ => return Err(corrupt(&stream, "epoch")),
        };
        let expires_at = *d
            .get_datetime("expiresAt")
            .map_err(|_| corrupt(&stream, "expiresAt"))?;
        Ok(Self {
            stream,
            owner,
            epoch,
            expires_at,
        })
    }

    /// Whether the lease is still held at `now`.
    pub fn is_held_at(&self, now: DateTime) -> bool {
        self.expires_at > now
    }
}

impl From<LeaseDocument> for Lease {
    fn from(d: LeaseDocument) -> Lease {
        Lease {
            stream: d.stream,
            owner: d.owner,
            epoch: d.epoch,
            expires_at: d.expires_at,
        }
    }
}

/// The lease's length in milliseconds, for `$add` with `$$NOW`.
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

impl MongoBackend {
    fn locks(&self) -> Collection<Document> {
        self.client.database(&self.database).collection(LOCKS)
    }

    /// Runs one conditional `findAndModify` on a lease; the document after it, if any.
    async fn modify_lease(
        &self,
        filter: Document,
        update: Vec<Document>,
        upsert: bool,
    ) -> Result<Option<Document>, mongodb::error::Error> {
        self.locks()
            .find_one_and_update(filter, update)
            .upsert(upsert)
            .return_document(ReturnDocument::After)
            .await
    }

    /// Refuses (`Fenced`) a write of `stream` carrying `epoch` (and `owner`) unless it is the
    /// epoch of the stream's lease now.
    pub(crate) async fn check_fence(
        &self,
        stream: &str,
        owner: Option<&str>,
        epoch: i64,
    ) -> Result<(), StoreError> {
        let current = match &self.fence_leases {
            Some(leases) => leases.current(stream).await?,
            None => LeaseStore::current(self, stream).await?,
        };
        flowwarden::port::check_fence(
            stream,
            current.as_ref().map(|l| (l.owner.as_str(), l.epoch)),
            owner,
            epoch,
        )
    }
}

fn parse_lease(found: Option<Document>) -> Result<Option<Lease>, StoreError> {
    found
        .as_ref()
        .map(|d| LeaseDocument::from_document(d).map(Lease::from))
        .transpose()
}

#[async_trait]
impl LeaseStore for MongoBackend {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        // Free (expired or released) by the server's clock, or already ours: take it and
        // increment the epoch. A live lease of another owner matches nothing, and the upsert
        // then collides with the existing `_id` (E11000): not ours.
        let filter = doc! {
            "_id": stream,
            "$expr": { "$or": [
                { "$lte": ["$expiresAt", "$$NOW"] },
                { "$eq": ["$owner", owner] },
            ] },
        };
        let update = vec![doc! { "$set": {
            "owner": owner,
            "epoch": { "$add": [ { "$ifNull": ["$epoch", 0_i64] }, 1_i64 ] },
            "expiresAt": { "$add": ["$$NOW", ttl_ms(ttl)] },
        } }];
        match self.modify_lease(filter, update, true).await {
            Ok(found) => parse_lease(found),
            Err(e) if code_of(&e) == Some(DUPLICATE_KEY) => Ok(None),
            Err(e) => Err(store_error(
                &format!("taking the lease of stream '{stream}'"),
                &e,
            )),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let filter = doc! { "_id": &lease.stream, "owner": &lease.owner, "epoch": lease.epoch };
        let update = vec![doc! { "$set": { "expiresAt": { "$add": ["$$NOW", ttl_ms(ttl)] } } }];
        let found = self
            .modify_lease(filter, update, false)
            .await
            .map_err(|e| {
                store_error(
                    &format!("renewing the lease of stream '{}'", lease.stream),
                    &e,
                )
            })?;
        parse_lease(found)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        // Keeps the document (and so the epoch); only makes it free now.
        let filter = doc! { "_id": &lease.stream, "owner": &lease.owner, "epoch": lease.epoch };
        let update = vec![doc! { "$set": { "expiresAt": "$$NOW" } }];
        self.locks()
            .update_one(filter, update)
            .await
            .map(|_| ())
            .map_err(|e| {
                store_error(
                    &format!("releasing the lease of stream '{}'", lease.stream),
                    &e,
                )
            })
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        let found = self
            .locks()
            .find_one(doc! { "_id": stream })
            .await
            .map_err(|e| store_error(&format!("reading the lease of stream '{stream}'"), &e))?;
        parse_lease(found)
    }
}

fn corrupt(stream: &str, field: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        format!("lease of stream '{stream}' in _fw_locks: field `{field}` is missing or malformed"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let l = LeaseDocument {
            stream: "orders".into(),
            owner: "host-1".into(),
            epoch: 4,
            expires_at: DateTime::from_millis(10_000),
        };
        assert_eq!(
            LeaseDocument::from_document(&l.to_document()),
            Ok(l.clone())
        );
        assert!(l.is_held_at(DateTime::from_millis(9_999)));
        assert!(!l.is_held_at(DateTime::from_millis(10_000)));
        let mut d = l.to_document();
        d.insert("epoch", "four");
        let e = LeaseDocument::from_document(&d).unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Corrupt);
        assert!(e.message.contains("orders") && e.message.contains("epoch"));
    }
}
