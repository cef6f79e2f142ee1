//! Reading a collection's existing documents for an initial snapshot
//! (`start_position = Snapshot`): what the engine asks a source for, batch by batch.

use bson::{doc, Bson, Document};

use crate::bson_order::{aliases_after, type_bracket};

/// One batch of an initial snapshot's scan: the next documents of a collection in `_id`
/// order, after the last one already handed over.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanRequest {
    /// The stream's name (for logs and errors).
    pub stream: &'static str,
    /// Database; `None` means the backend's default database.
    pub database: Option<String>,
    /// Collection.
    pub collection: String,
    /// A query filter on the documents (the stream's `#[pipeline]` `$match` conditions on
    /// `fullDocument.*` that could be carried over; empty when none could). It may let more
    /// documents through than the pipeline would, never fewer.
    pub filter: Document,
    /// Only documents whose `_id` sorts after this one, in MongoDB's order across types;
    /// `None` for the first batch.
    pub after: Option<Bson>,
    /// At most this many documents.
    pub limit: u32,
}

/// A query filter for "`_id` sorts after `last`" in MongoDB's order across types.
///
/// `{_id: {$gt: last}}` alone only matches `_id`s of `last`'s own type bracket (query
/// comparisons never cross brackets), so a collection whose `_id`s mix types (numbers, then
/// strings, then ObjectIds) would be scanned only up to the end of the first type: a silent
/// gap. The filter therefore also takes every `_id` of a later type:
/// `{$or: [{_id: {$gt: last}}, {_id: {$type: [<types that sort after last's>]}}]}`. Both
/// branches can use the `_id` index.
pub fn ids_after(last: &Bson) -> Document {
    let later = aliases_after(type_bracket(last));
    if later.is_empty() {
        return doc! {"_id": {"$gt": last.clone()}};
    }
    doc! {"$or": [
        {"_id": {"$gt": last.clone()}},
        {"_id": {"$type": later}},
    ]}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_after_an_id_also_takes_later_types() {
        let f = ids_after(&Bson::Int32(5));
        let branches = f.get_array("$or").expect("two branches");
        assert_eq!(branches[0], Bson::Document(doc! {"_id": {"$gt": 5}}));
        let types = branches[1]
            .as_document()
            .and_then(|d| d.get_document("_id").ok())
            .and_then(|d| d.get_array("$type").ok())
            .expect("a $type branch");
        assert!(types.contains(&Bson::String("string".into())));
        assert!(types.contains(&Bson::String("objectId".into())));
        assert!(!types.contains(&Bson::String("long".into())));
        assert_eq!(
            ids_after(&Bson::MaxKey),
            doc! {"_id": {"$gt": Bson::MaxKey}}
        );
    }
}
