//! Which conditions of a stream's `#[pipeline]` an initial snapshot's scan applies itself.
//!
//! A change stream's `$match` judges change events; a scan reads plain documents. A condition
//! on `fullDocument.<path>` is the same condition on `<path>` of the document, and one on
//! `documentKey._id` is one on `_id`, so those are carried over. Everything else cannot be:
//! `operationType`, `ns`, `updateDescription`, `$expr`, and every stage after the first stage
//! that is not a `$match` (it reshapes what later stages see). What cannot be carried over is
//! left out, which lets more documents through, never fewer: an `$or` or `$nor` is carried
//! over whole or not at all, while the members of a top-level `$and` are judged one by one.
//! The stream's `#[filter]` still judges every scanned document.

use bson::{Bson, Document};

/// The query filter a scan applies, and what of the pipeline it had to leave out.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct ScanFilter {
    /// The conditions carried over (empty: every document).
    pub(crate) filter: Document,
    /// What was left out, for the log at the start of the scan.
    pub(crate) left_out: Vec<String>,
}

const FULL_DOCUMENT: &str = "fullDocument.";

/// Carries the pipeline's leading `$match` conditions over to a scan of the collection.
pub(crate) fn scan_filter(pipeline: &[Document]) -> ScanFilter {
    let mut conjuncts: Vec<Document> = Vec::new();
    let mut left_out = Vec::new();
    for (i, stage) in pipeline.iter().enumerate() {
        let matched = match (stage.len(), stage.get_document("$match")) {
            (1, Ok(m)) => m,
            _ => {
                let name = stage.keys().next().map_or("an empty stage", String::as_str);
                left_out.push(format!(
                    "stage {} (`{name}`) and every stage after it",
                    i + 1
                ));
                break;
            }
        };
        for (key, value) in matched {
            if key == "$and" {
                let Some(members) = value.as_array() else {
                    left_out.push("a malformed `$and`".into());
                    continue;
                };
                for member in members {
                    match member.as_document().and_then(translate_all) {
                        Some(d) => conjuncts.push(d),
                        None => left_out.push(format!("`$and` member {member}")),
                    }
                }
                continue;
            }
            match translate(key, value) {
                Some((k, v)) => {
                    let mut d = Document::new();
                    d.insert(k, v);
                    conjuncts.push(d);
                }
                None => left_out.push(format!("`{key}`")),
            }
        }
    }
    let filter = match conjuncts.len() {
        0 => Document::new(),
        1 => conjuncts.remove(0),
        _ => {
            let mut d = Document::new();
            d.insert(
                "$and",
                conjuncts
                    .into_iter()
                    .map(Bson::Document)
                    .collect::<Vec<_>>(),
            );
            d
        }
    };
    ScanFilter { filter, left_out }
}

/// One condition of a `$match` on a change event, as the same condition on the document.
fn translate(key: &str, value: &Bson) -> Option<(String, Bson)> {
    if let Some(path) = key.strip_prefix(FULL_DOCUMENT) {
        return (!path.is_empty()).then(|| (path.to_owned(), value.clone()));
    }
    if key == "documentKey._id" {
        return Some(("_id".to_owned(), value.clone()));
    }
    if key == "$or" || key == "$nor" {
        let members = value.as_array()?;
        let translated: Option<Vec<Bson>> = members
            .iter()
            .map(|m| m.as_document().and_then(translate_all).map(Bson::Document))
            .collect();
        return Some((key.to_owned(), Bson::Array(translated?)));
    }
    None
}

/// A whole condition document, or `None` when any part of it cannot be carried over.
fn translate_all(d: &Document) -> Option<Document> {
    let mut out = Document::new();
    for (key, value) in d {
        let (k, v) = if key == "$and" {
            let members: Option<Vec<Bson>> = value
                .as_array()?
                .iter()
                .map(|m| m.as_document().and_then(translate_all).map(Bson::Document))
                .collect();
            ("$and".to_owned(), Bson::Array(members?))
        } else {
            translate(key, value)?
        };
        out.insert(k, v);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn conditions_on_the_document_are_carried_over() {
        let f = scan_filter(&[
            doc! {"$match": {"fullDocument.status": "PAID", "operationType": "insert"}},
        ]);
        assert_eq!(f.filter, doc! {"status": "PAID"});
        assert_eq!(f.left_out, vec!["`operationType`".to_owned()]);

        let f = scan_filter(&[
            doc! {"$match": {"fullDocument.total": {"$gte": 10}}},
            doc! {"$match": {"documentKey._id": {"$in": [1, 2]}}},
        ]);
        assert_eq!(
            f.filter,
            doc! {"$and": [{"total": {"$gte": 10}}, {"_id": {"$in": [1, 2]}}]}
        );
        assert!(f.left_out.is_empty());
    }

    #[test]
    fn an_or_is_carried_over_whole_or_not_at_all() {
        let whole = scan_filter(&[doc! {"$match": {"$or": [
            {"fullDocument.status": "PAID"}, {"fullDocument.vip": true}
        ]}}]);
        assert_eq!(
            whole.filter,
            doc! {"$or": [{"status": "PAID"}, {"vip": true}]}
        );
        // Dropping one branch of an `$or` would narrow it: the whole `$or` is left out.
        let partial = scan_filter(&[doc! {"$match": {"$or": [
            {"fullDocument.status": "PAID"}, {"operationType": "delete"}
        ]}}]);
        assert_eq!(partial.filter, doc! {});
        assert_eq!(partial.left_out.len(), 1);
    }

    #[test]
    fn members_of_a_top_level_and_are_judged_one_by_one() {
        let f = scan_filter(&[doc! {"$match": {"$and": [
            {"fullDocument.a": 1}, {"$expr": {"$eq": ["$ns.coll", "x"]}}
        ]}}]);
        assert_eq!(f.filter, doc! {"a": 1});
        assert_eq!(f.left_out.len(), 1);
    }

    #[test]
    fn stages_after_a_reshaping_stage_are_left_out() {
        let f = scan_filter(&[
            doc! {"$match": {"fullDocument.a": 1}},
            doc! {"$project": {"fullDocument.secret": 0}},
            doc! {"$match": {"fullDocument.b": 2}},
        ]);
        assert_eq!(f.filter, doc! {"a": 1});
        assert_eq!(f.left_out.len(), 1);
        assert!(f.left_out[0].contains("$project"));
        assert_eq!(scan_filter(&[]), ScanFilter::default());
    }
}
