//! Reads of `local.oplog.rs`: the entries as `find` returns them (`ts`, `op`, `ns`, `wall`).

use bson::{doc, Document};

use super::{as_i64, get_doc, parse_filter, State};
use crate::error::CommandError;
use crate::state::OpKind;

pub(super) fn oplog_docs(st: &State, body: &Document) -> Result<Vec<Document>, CommandError> {
    let filter = parse_filter(body, "filter")?;
    let reverse = get_doc(body, "sort")?
        .and_then(|s| as_i64(s.get("$natural")))
        .is_some_and(|d| d < 0);
    let limit = usize::try_from(as_i64(body.get("limit")).unwrap_or(0).unsigned_abs())
        .unwrap_or(usize::MAX);
    let limit = if limit == 0 { usize::MAX } else { limit };
    let to_doc = |e: &crate::state::Entry| {
        let op = match e.kind {
            OpKind::Noop => "n",
            OpKind::Insert { .. } => "i",
            OpKind::Update { .. } | OpKind::Replace { .. } => "u",
            OpKind::Delete { .. } => "d",
            _ => "c",
        };
        doc! {"ts": e.ts, "op": op, "ns": format!("{}.{}", e.db, e.coll), "wall": e.wall}
    };
    let iter: Box<dyn Iterator<Item = &crate::state::Entry>> = if reverse {
        Box::new(st.data.oplog.iter().rev())
    } else {
        Box::new(st.data.oplog.iter())
    };
    Ok(iter
        .map(to_doc)
        .filter(|d| filter.matches(d))
        .take(limit)
        .collect())
}
