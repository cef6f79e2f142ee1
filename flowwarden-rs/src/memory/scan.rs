//! The in-memory backend's answer to an initial snapshot's scan: the next documents of a
//! collection in `_id` order, in MongoDB's order across types.

use std::cmp::Ordering;

use bson::Document;

use super::State;
use crate::matcher::compare_bson;
use crate::matcher::Filter;
use crate::port::{ScanRequest, SourceError, SourceErrorKind};

/// At most `request.limit` documents of `db.collection` matching the request's filter whose
/// `_id` sorts after `request.after`, in `_id` order.
pub(super) fn scan(
    st: &State,
    db: &str,
    request: &ScanRequest,
) -> Result<Vec<Document>, SourceError> {
    let filter = Filter::parse(&request.filter).map_err(|e| {
        SourceError::new(
            SourceErrorKind::Configuration,
            format!(
                "stream '{}': the snapshot's filter (from the #[pipeline]) is not supported: {e}",
                request.stream
            ),
        )
    })?;
    let Some(coll) = st
        .collections
        .get(&(db.to_owned(), request.collection.clone()))
    else {
        return Ok(Vec::new());
    };
    let id_of = |d: &Document| d.get("_id").cloned().unwrap_or(bson::Bson::Null);
    let mut next: Vec<_> = coll
        .documents()
        .filter(|d| match &request.after {
            Some(after) => compare_bson(&id_of(d), after) == Ordering::Greater,
            None => true,
        })
        .filter(|d| filter.matches(d))
        .collect();
    next.sort_by(|a, b| compare_bson(&id_of(a), &id_of(b)));
    next.truncate(usize::try_from(request.limit).unwrap_or(usize::MAX));
    Ok(next.into_iter().map(|d| (**d).clone()).collect())
}
