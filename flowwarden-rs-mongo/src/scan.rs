//! The scan of an initial snapshot (`start_position = Snapshot`): one `find` per batch on the
//! stream's collection, in `_id` order, after the last `_id` already handed over.
//!
//! Each batch is its own query (`find` + `sort {_id: 1}` + `limit`), not one long cursor: a
//! cursor kept open across a slow handler would time out on the server (10 minutes idle) or
//! be lost on a step-down, and every batch starts from the last settled `_id` anyway, so a
//! failed batch is simply asked again. The query:
//!
//! - keeps the documents after the last `_id` in MongoDB's order across types
//!   ([`flowwarden::port::ids_after`]), so mixed `_id` types are all read;
//! - adds the conditions the runtime carried over from the `#[pipeline]` (`request.filter`);
//! - reads with read concern `majority`, as the change stream does: a document the scan hands
//!   over is one that cannot be rolled back, so the stream never has to report a rollback the
//!   projection already absorbed;
//! - uses the collection's default collation (the one its `_id` index has), so the sort and the
//!   `$gt` of the next batch agree and the `_id` index serves both.

use bson::{doc, Bson, Document};
use flowwarden::port::{ids_after, ScanRequest, SourceError};
use futures::TryStreamExt;
use mongodb::options::ReadConcern;

use crate::classify::classify;
use crate::MongoBackend;

/// The query filter of one batch: the carried-over conditions and "after the last `_id`".
pub(crate) fn batch_filter(request: &ScanRequest) -> Document {
    let mut conditions: Vec<Document> = Vec::with_capacity(2);
    if !request.filter.is_empty() {
        conditions.push(request.filter.clone());
    }
    if let Some(last) = &request.after {
        conditions.push(ids_after(last));
    }
    match conditions.len() {
        0 => Document::new(),
        1 => conditions.remove(0),
        _ => doc! {"$and": conditions.into_iter().map(Bson::Document).collect::<Vec<_>>()},
    }
}

impl MongoBackend {
    /// Reads the next batch of a scan (see the module documentation).
    pub(crate) async fn scan_batch(
        &self,
        request: &ScanRequest,
    ) -> Result<Vec<Document>, SourceError> {
        let db = request.database.as_deref().unwrap_or(&self.database);
        let coll = self
            .client
            .database(db)
            .collection::<Document>(&request.collection);
        let filter = batch_filter(request);
        let fail = |e: &mongodb::error::Error| {
            let mut err = classify(e);
            err.message = format!(
                "stream '{}': reading {db}.{} for the initial snapshot failed: {}",
                request.stream, request.collection, err.message
            );
            err
        };
        let cursor = coll
            .find(filter)
            .sort(doc! {"_id": 1})
            .limit(i64::from(request.limit))
            .batch_size(request.limit)
            .read_concern(ReadConcern::majority())
            .await
            .map_err(|e| fail(&e))?;
        cursor.try_collect().await.map_err(|e| fail(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(filter: Document, after: Option<Bson>) -> ScanRequest {
        ScanRequest {
            stream: "s",
            database: None,
            collection: "c".into(),
            filter,
            after,
            limit: 10,
        }
    }

    #[test]
    fn the_first_batch_is_the_carried_over_filter_alone() {
        assert_eq!(batch_filter(&request(doc! {}, None)), doc! {});
        assert_eq!(
            batch_filter(&request(doc! {"status": "PAID"}, None)),
            doc! {"status": "PAID"}
        );
    }

    #[test]
    fn later_batches_add_the_ids_after_the_last_one() {
        let last = Bson::String("k".into());
        assert_eq!(
            batch_filter(&request(doc! {}, Some(last.clone()))),
            ids_after(&last)
        );
        assert_eq!(
            batch_filter(&request(doc! {"status": "PAID"}, Some(last.clone()))),
            doc! {"$and": [{"status": "PAID"}, ids_after(&last)]}
        );
    }
}
