//! The checkpoint store (`_fw_checkpoints`), the dead-letter store (`_fw_dlq`) and the indexes
//! of the `_fw_` collections.

use async_trait::async_trait;
use bson::{doc, Document};
use flowwarden::port::codec::{
    decode_checkpoint, decode_dead_letter, encode_checkpoint, encode_dead_letter, encoded_len,
    is_claim_only, CLAIMED_AT,
};
use flowwarden::port::{
    Checkpoint, CheckpointStore, DeadLetterQuery, DeadLetterRecord, DeadLetterStatus,
    DeadLetterStore, Fence, PutOutcome, StoreError, StoreErrorKind,
};
use futures::TryStreamExt;
use mongodb::error::{Error, ErrorKind, WriteFailure};
use mongodb::options::IndexOptions;
use mongodb::{Collection, Database, IndexModel};
use tracing::{debug, warn};

use crate::{MongoBackend, CHECKPOINTS, DEAD_LETTERS};

/// Name of the listing index of `_fw_dlq`.
pub const DLQ_INDEX: &str = "stream_1_status_1_firstFailedAt_1";

/// The largest dead-letter record stored: 16 MiB minus headroom for the command around it.
pub const MAX_RECORD_BYTES: usize = flowwarden::port::codec::MAX_BSON_RECORD_BYTES;

pub(crate) const DUPLICATE_KEY: i32 = 11000;

/// Creates the indexes of the `_fw_` collections (idempotent).
pub(crate) async fn create_indexes(db: &Database) -> Result<(), Error> {
    db.collection::<Document>(DEAD_LETTERS)
        .create_index(
            IndexModel::builder()
                .keys(doc! { "stream": 1, "status": 1, "firstFailedAt": 1 })
                .options(IndexOptions::builder().name(DLQ_INDEX.to_owned()).build())
                .build(),
        )
        .await?;
    debug!(
        database = db.name(),
        "indexes of the _fw_ collections are in place"
    );
    Ok(())
}

/// The code of a server or write error.
pub(crate) fn code_of(e: &Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

/// A driver error as a store error: too large, unauthorized (`Other`), else `Unavailable`
/// (network, server selection, step-down, timeouts: try again later).
pub(crate) fn store_error(what: &str, e: &Error) -> StoreError {
    let kind = match (code_of(e), e.kind.as_ref()) {
        (Some(10334 | 17419 | 17420), _) => StoreErrorKind::TooLarge,
        (Some(13), _) => StoreErrorKind::Other,
        (_, ErrorKind::InvalidArgument { .. }) => StoreErrorKind::Other,
        _ => StoreErrorKind::Unavailable,
    };
    StoreError::new(kind, format!("{what}: {}", crate::short_error(e)))
}

impl MongoBackend {
    fn db(&self) -> Database {
        self.client.database(&self.database)
    }

    fn checkpoints(&self) -> Collection<Document> {
        self.db().collection(CHECKPOINTS)
    }

    fn dead_letters_coll(&self) -> Collection<Document> {
        self.db().collection(DEAD_LETTERS)
    }

    async fn dlq(&self) -> Result<Collection<Document>, StoreError> {
        self.indexes_ready()
            .await
            .map_err(|e| store_error("creating the indexes of the _fw_ collections", &e))?;
        Ok(self.dead_letters_coll())
    }
}

#[async_trait]
impl CheckpointStore for MongoBackend {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.indexes_ready()
            .await
            .map_err(|e| store_error("creating the indexes of the _fw_ collections", &e))?;
        let found = self
            .checkpoints()
            .find_one(doc! { "_id": stream })
            .await
            .map_err(|e| {
                store_error(&format!("loading the checkpoint of stream '{stream}'"), &e)
            })?;
        match found {
            None => Ok(None),
            Some(d) if is_claim_only(&d) => Ok(None),
            Some(d) => decode_checkpoint(&d)
                .map(Some)
                .map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e.to_string())),
        }
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let stream = &checkpoint.stream;
        // A leader's write: refused once its lease is no longer current (read just before the
        // write), and, atomically in the write's filter, when the stored checkpoint carries a
        // newer epoch (see docs/deployment.md, "Fencing on MongoDB").
        if let Some(epoch) = checkpoint.epoch {
            self.check_fence(stream, checkpoint.owner.as_deref(), epoch)
                .await?;
        }
        let replacement = encode_checkpoint(checkpoint);
        let filter = match checkpoint.epoch {
            None => doc! { "_id": stream },
            Some(epoch) => doc! {
                "_id": stream,
                "$or": [ { "epoch": { "$exists": false } }, { "epoch": { "$lte": epoch } } ],
            },
        };
        match self
            .checkpoints()
            .replace_one(filter, replacement)
            .upsert(true)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if code_of(&e) == Some(DUPLICATE_KEY) && checkpoint.epoch.is_some() => {
                // No document with an epoch at or below ours, and the upsert collided with the
                // existing `_id`: another owner holds a newer epoch.
                Err(StoreError::new(
                    StoreErrorKind::Fenced,
                    format!(
                        "checkpoint of stream '{stream}' is owned with an epoch newer than {}",
                        checkpoint.epoch.unwrap_or_default()
                    ),
                ))
            }
            Err(e) => Err(store_error(
                &format!("writing the checkpoint of stream '{stream}'"),
                &e,
            )),
        }
    }

    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError> {
        self.check_fence(key, Some(&fence.owner), fence.epoch)
            .await?;
        let filter = doc! {
            "_id": key,
            "$or": [ { "epoch": { "$exists": false } }, { "epoch": { "$lte": fence.epoch } } ],
        };
        // Sets only the fencing fields: a stored checkpoint keeps its positions; a missing one
        // becomes a claim-only document, which loads as no checkpoint.
        let update = doc! {
            "$set": {
                "owner": &fence.owner,
                "epoch": fence.epoch,
                CLAIMED_AT: bson::DateTime::now(),
            }
        };
        match self
            .checkpoints()
            .update_one(filter, update)
            .upsert(true)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if code_of(&e) == Some(DUPLICATE_KEY) => Err(StoreError::new(
                StoreErrorKind::Fenced,
                format!(
                    "checkpoint of stream '{key}' is claimed with an epoch newer than {}",
                    fence.epoch
                ),
            )),
            Err(e) => Err(store_error(
                &format!("claiming the checkpoint of stream '{key}'"),
                &e,
            )),
        }
    }
}

#[async_trait]
impl DeadLetterStore for MongoBackend {
    async fn put(&self, record: &DeadLetterRecord) -> Result<PutOutcome, StoreError> {
        let doc = encode_dead_letter(record);
        let size = encoded_len(&doc);
        if size > MAX_RECORD_BYTES {
            return Err(StoreError::new(
                StoreErrorKind::TooLarge,
                format!(
                    "dead-letter record '{}' is {size} bytes, over {MAX_RECORD_BYTES}",
                    record.id
                ),
            ));
        }
        let coll = self.dlq().await?;
        // Fenced by the lease's epoch before and after the insert: a leader deposed before the
        // write is refused; one deposed during it removes what it wrote (see
        // docs/deployment.md, "Fencing on MongoDB").
        if let Some(epoch) = record.epoch {
            self.check_fence(&record.stream, record.owner.as_deref(), epoch)
                .await?;
        }
        match coll.insert_one(doc).await {
            Ok(_) => {
                if let Some(epoch) = record.epoch {
                    if let Err(e) = self
                        .check_fence(&record.stream, record.owner.as_deref(), epoch)
                        .await
                    {
                        if e.kind == StoreErrorKind::Fenced {
                            // Only while it is still ours: a newer leader that merged its own
                            // failure into it has set its epoch, and keeps the record.
                            let _ = coll
                                .delete_one(doc! { "_id": &record.id, "epoch": epoch })
                                .await;
                        }
                        return Err(e);
                    }
                }
                Ok(PutOutcome::Inserted)
            }
            Err(e) if code_of(&e) == Some(DUPLICATE_KEY) => {
                let mut set = doc! {
                    "lastFailedAt": record.last_failed_at,
                    "errorChain": record.error_chain.clone(),
                    "errorKind": &record.error_kind,
                    "status": DeadLetterStatus::Pending.as_str(),
                };
                let mut filter = doc! { "_id": &record.id };
                if let Some(epoch) = record.epoch {
                    // Never merged into a record a newer leader wrote.
                    filter.insert(
                        "$or",
                        vec![
                            doc! { "epoch": { "$exists": false } },
                            doc! { "epoch": { "$lte": epoch } },
                        ],
                    );
                    set.insert("epoch", epoch);
                    set.insert("owner", record.owner.clone());
                }
                let update = doc! {
                    "$inc": { "attempts": i64::from(record.attempts) },
                    "$set": set,
                };
                let r = coll.update_one(filter, update).await.map_err(|e| {
                    store_error(&format!("updating dead-letter record '{}'", record.id), &e)
                })?;
                if r.matched_count == 0 && record.epoch.is_some() {
                    return Err(StoreError::new(
                        StoreErrorKind::Fenced,
                        format!(
                            "dead-letter record '{}' was written by a newer leader than epoch {}",
                            record.id,
                            record.epoch.unwrap_or_default()
                        ),
                    ));
                }
                Ok(PutOutcome::AlreadyPresent)
            }
            Err(e) => {
                warn!(id = %record.id, error = %crate::short_error(&e), "dead-letter write failed");
                Err(store_error(
                    &format!("writing dead-letter record '{}'", record.id),
                    &e,
                ))
            }
        }
    }

    async fn list(&self, query: &DeadLetterQuery) -> Result<Vec<DeadLetterRecord>, StoreError> {
        let mut filter = Document::new();
        if let Some(s) = &query.stream {
            filter.insert("stream", s);
        }
        if let Some(s) = query.status {
            filter.insert("status", s.as_str());
        }
        let coll = self.dlq().await?;
        let mut find = coll
            .find(filter)
            .sort(doc! { "firstFailedAt": 1, "_id": 1 });
        if let Some(limit) = query.limit {
            find = find.limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let docs: Vec<Document> = find
            .await
            .map_err(|e| store_error("listing dead letters", &e))?
            .try_collect()
            .await
            .map_err(|e| store_error("listing dead letters", &e))?;
        docs.iter().map(decode_dead_letter).collect()
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError> {
        let coll = self.dlq().await?;
        coll.find_one(doc! { "_id": id })
            .await
            .map_err(|e| store_error(&format!("reading dead-letter record '{id}'"), &e))?
            .as_ref()
            .map(decode_dead_letter)
            .transpose()
    }

    async fn set_status(&self, id: &str, status: DeadLetterStatus) -> Result<bool, StoreError> {
        let coll = self.dlq().await?;
        let r = coll
            .update_one(
                doc! { "_id": id },
                doc! { "$set": { "status": status.as_str() } },
            )
            .await
            .map_err(|e| store_error(&format!("updating dead-letter record '{id}'"), &e))?;
        Ok(r.matched_count > 0)
    }

    fn max_record_bytes(&self) -> usize {
        MAX_RECORD_BYTES
    }
}
