//! Reads of collections: `find` and `count`, and the filtering and sorting that the writes and
//! `aggregate` reuse.

use std::cmp::Ordering;
use std::sync::Arc;

use bson::{doc, Bson, DateTime, Document};
use flowwarden::matcher::{compare_bson, get_path, Filter, Projection};

use super::cursors::open_find_cursor;
use super::oplog::oplog_docs;
use super::{as_i64, batch_size, coll_name, get_doc, ok, parse_filter, truthy, CmdResult, State};
use crate::error::CommandError;
use crate::state::Collection;

pub(super) fn matching(
    c: Option<&Collection>,
    filter: &Filter,
    now: DateTime,
) -> Vec<(u64, Arc<Document>)> {
    c.map(|c| {
        c.docs
            .iter()
            .filter(|(_, d)| filter.matches_at(d, now))
            .map(|(rid, d)| (*rid, d.clone()))
            .collect()
    })
    .unwrap_or_default()
}

pub(super) fn sort_docs(docs: &mut [Arc<Document>], sort: &Document) -> Result<(), CommandError> {
    let mut keys = Vec::new();
    for (k, v) in sort {
        let dir = match as_i64(Some(v)) {
            Some(1) => Ordering::Less,
            Some(-1) => Ordering::Greater,
            _ => return Err(CommandError::bad_value(format!("$sort key ordering must be 1 (for ascending) or -1 (for descending), found {v} for '{k}'"))),
        };
        keys.push((k.clone(), dir));
    }
    if keys.len() == 1 && keys[0].0 == "$natural" {
        if keys[0].1 == Ordering::Greater {
            docs.reverse();
        }
        return Ok(());
    }
    docs.sort_by(|a, b| {
        for (k, dir) in &keys {
            let va = get_path(a, k).unwrap_or(&Bson::Null);
            let vb = get_path(b, k).unwrap_or(&Bson::Null);
            let o = compare_bson(va, vb);
            if o != Ordering::Equal {
                return if *dir == Ordering::Less {
                    o
                } else {
                    o.reverse()
                };
            }
        }
        Ordering::Equal
    });
    Ok(())
}

fn query(
    st: &State,
    db: &str,
    coll: &str,
    body: &Document,
    filter_key: &str,
) -> Result<Vec<Arc<Document>>, CommandError> {
    let filter = parse_filter(body, filter_key)?;
    let mut docs: Vec<Arc<Document>> = matching(st.data.coll(db, coll), &filter, st.now())
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    if let Some(sort) = get_doc(body, "sort")? {
        sort_docs(&mut docs, sort)?;
    }
    let skip = usize::try_from(as_i64(body.get("skip")).unwrap_or(0).max(0)).unwrap_or(0);
    let limit = as_i64(body.get("limit")).unwrap_or(0).unsigned_abs();
    let mut docs: Vec<Arc<Document>> = docs.into_iter().skip(skip).collect();
    if limit > 0 {
        docs.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok(docs)
}

pub(super) fn find(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "find")?;
    let projection = get_doc(body, "projection")?
        .map(Projection::parse)
        .transpose()?;
    let docs: Vec<Document> = if db == "local" && coll == "oplog.rs" {
        if st.deny_oplog_reads {
            return Err(CommandError::new(
                13,
                "Unauthorized",
                "not authorized on local to execute command { find: \"oplog.rs\" }",
            ));
        }
        oplog_docs(st, body)?
    } else {
        query(st, db, coll, body, "filter")?
            .into_iter()
            .map(|d| match &projection {
                Some(p) => p.apply(&d),
                None => (*d).clone(),
            })
            .collect()
    };
    let single =
        truthy(body.get("singleBatch")) || as_i64(body.get("limit")).is_some_and(|l| l < 0);
    let batch = batch_size(body.get("batchSize"))?;
    open_find_cursor(st, format!("{db}.{coll}"), docs, batch, single)
}

pub(super) fn count(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "count")?;
    let n = query(st, db, coll, body, "query")?.len();
    ok(doc! {"n": i64::try_from(n).unwrap_or(i64::MAX), "ok": 1.0})
}
