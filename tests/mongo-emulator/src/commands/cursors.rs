//! Open cursors: the results a `find`, `listCollections`, `listIndexes` or `aggregate` has not
//! returned yet and the change streams, their first and later batches, `getMore` and
//! `killCursors`.

use std::collections::VecDeque;

use bson::{doc, Bson, Document, RawDocumentBuf};

use super::{as_i64, batch_size, ok, raw, CmdResult, Reply, State};
use crate::changestream::{ChangeCursor, MAX_BSON};
use crate::error::CommandError;

/// A find/aggregate cursor holding its remaining results.
#[derive(Debug)]
pub(crate) struct FindCursor {
    ns: String,
    docs: VecDeque<Document>,
}

/// An open cursor.
#[derive(Debug)]
pub(crate) enum Cursor {
    Find(FindCursor),
    Change(Box<ChangeCursor>),
}

/// Builds `{cursor: {firstBatch|nextBatch, id, ns, postBatchResumeToken?}, ok: 1}`.
pub(crate) fn cursor_reply(
    id: i64,
    ns: &str,
    first: bool,
    batch: Vec<RawDocumentBuf>,
    pbrt: Option<&Document>,
) -> CmdResult {
    let mut arr = bson::RawArrayBuf::new();
    for d in batch {
        arr.push(d);
    }
    let mut cursor = RawDocumentBuf::new();
    cursor.append(if first { "firstBatch" } else { "nextBatch" }, arr);
    if let Some(t) = pbrt {
        cursor.append("postBatchResumeToken", raw(t)?);
    }
    cursor.append("id", id);
    cursor.append("ns", ns);
    let mut reply = RawDocumentBuf::new();
    reply.append("cursor", cursor);
    reply.append("ok", 1.0);
    Ok(Reply::Raw(reply))
}

/// Splits a result list into a first batch and a stored cursor.
pub(super) fn open_find_cursor(
    st: &mut State,
    ns: String,
    docs: Vec<Document>,
    batch: Option<usize>,
    single: bool,
) -> CmdResult {
    let mut docs: VecDeque<Document> = docs.into();
    let first = take_batch(&mut docs, batch.unwrap_or(101))?;
    let id = if docs.is_empty() || single {
        0
    } else {
        let id = st.new_cursor_id();
        st.cursors.insert(
            id,
            Cursor::Find(FindCursor {
                ns: ns.clone(),
                docs,
            }),
        );
        id
    };
    cursor_reply(id, &ns, true, first, None)
}

fn take_batch(
    docs: &mut VecDeque<Document>,
    max: usize,
) -> Result<Vec<RawDocumentBuf>, CommandError> {
    let mut out = Vec::new();
    let mut bytes = 0;
    while out.len() < max {
        let Some(d) = docs.front() else { break };
        let r = raw(d)?;
        if !out.is_empty() && bytes + r.as_bytes().len() > MAX_BSON {
            break;
        }
        bytes += r.as_bytes().len();
        out.push(r);
        docs.pop_front();
    }
    Ok(out)
}

/// One step of `getMore`: returns the reply, or the receiver to wait on when a change stream
/// has nothing new yet and its deadline has not passed.
pub(crate) fn get_more_step(
    st: &mut State,
    body: &Document,
    deadline_passed: bool,
) -> Result<Result<Reply, tokio::sync::watch::Receiver<u64>>, CommandError> {
    let id = match body.get("getMore") {
        Some(Bson::Int64(n)) => *n,
        _ => {
            return Err(CommandError::type_mismatch(
                "BSON field 'getMore' is the wrong type, expected type 'long'",
            ))
        }
    };
    let batch = batch_size(body.get("batchSize"))?.filter(|n| *n > 0);
    let cursor = st
        .cursors
        .remove(&id)
        .ok_or_else(|| CommandError::cursor_not_found(id))?;
    match cursor {
        Cursor::Find(mut f) => {
            let out = take_batch(&mut f.docs, batch.unwrap_or(usize::MAX))?;
            let ns = f.ns.clone();
            let next = if f.docs.is_empty() { 0 } else { id };
            if next != 0 {
                st.cursors.insert(id, Cursor::Find(f));
            }
            Ok(Ok(cursor_reply(next, &ns, false, out, None)?))
        }
        Cursor::Change(mut c) => {
            let got = c.read(&st.data, batch.unwrap_or(usize::MAX))?;
            if !got.events.is_empty() || c.closed || deadline_passed {
                let next = if c.closed { 0 } else { id };
                let reply = cursor_reply(next, &c.ns, false, got.events, Some(&c.pbrt));
                if next != 0 {
                    st.cursors.insert(id, Cursor::Change(c));
                }
                return Ok(Ok(reply?));
            }
            let rx = st.data.head_tx.subscribe();
            st.cursors.insert(id, Cursor::Change(c));
            Ok(Err(rx))
        }
    }
}

/// Whether a cursor id belongs to an open change stream (for the step-down error labels).
pub(crate) fn is_change_cursor(st: &State, body: &Document) -> bool {
    matches!(body.get("getMore"), Some(Bson::Int64(id)) if matches!(st.cursors.get(id), Some(Cursor::Change(_))))
}

pub(super) fn kill_cursors(st: &mut State, body: &Document) -> CmdResult {
    let ids = match body.get("cursors") {
        Some(Bson::Array(ids)) => ids.clone(),
        _ => {
            return Err(CommandError::failed_to_parse(
                "BSON field 'cursors' is missing",
            ))
        }
    };
    let mut killed = Vec::new();
    let mut not_found = Vec::new();
    for id in ids {
        let Some(n) = as_i64(Some(&id)) else { continue };
        if st.cursors.remove(&n).is_some() {
            killed.push(Bson::Int64(n));
        } else {
            not_found.push(Bson::Int64(n));
        }
    }
    ok(doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    })
}
