//! Command handlers ("Database Commands" in the manual), run against the shared state.
//!
//! This module holds the [`State`] behind the lock, the dispatch of a command name to its
//! handler (with the answer to a retried write), the argument helpers the handlers share, and
//! [`finish`], which stamps every reply with the server's times. The handlers live by concept:
//!
//! - `collections`: databases and collections (`listDatabases`, `listCollections`, `create`,
//!   `collMod`, `drop`, `dropDatabase`, `renameCollection`);
//! - `indexes`: `createIndexes`, `listIndexes`, `dropIndexes`;
//! - `writes`: `insert`, `update`, `delete`, `findAndModify`;
//! - `queries`: `find`, `count`, and the filtering and sorting the other handlers reuse;
//! - `oplog`: reads of `local.oplog.rs`;
//! - `aggregate`: `aggregate`, including opening a change stream;
//! - `cursors`: open cursors, their batches, `getMore` and `killCursors`;
//! - `status`: `replSetGetStatus`, `serverStatus`;
//! - `transactions`: sessions' transactions, CRUD inside them, `commitTransaction`,
//!   `abortTransaction`.
//!
//! `hello` is answered by the server (`server.rs`), which also waits between the steps of a
//! change stream's `getMore`.

mod aggregate;
mod collections;
mod cursors;
mod indexes;
mod oplog;
mod queries;
mod status;
mod transactions;
mod writes;

use std::collections::HashMap;

use bson::{doc, Bson, DateTime, Document, RawBson, RawDocumentBuf};
use flowwarden::matcher::Filter;

use crate::error::CommandError;
use crate::state::Data;

use aggregate::aggregate;
use collections::{
    coll_mod, create, drop_coll, drop_database, list_collections, list_databases, rename,
};
use cursors::{kill_cursors, Cursor};
use indexes::{create_indexes, drop_indexes, list_indexes};
use queries::{count, find};
use status::{repl_status, server_status};
use writes::{delete, find_and_modify, insert, update};

pub(crate) use cursors::{get_more_step, is_change_cursor};
pub(crate) use transactions::{abort_after_injected, expire as expire_transactions};
pub(crate) use transactions::{sync_versions, Transactions};
pub(crate) use writes::insert_direct;

/// A reply body before `operationTime`/`$clusterTime` are added.
pub(crate) enum Reply {
    Doc(Document),
    Raw(RawDocumentBuf),
}

/// Everything behind the state lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) data: Data,
    pub(crate) cursors: HashMap<i64, Cursor>,
    next_cursor: i64,
    /// Last retryable write per session id: (txnNumber, reply), to answer a retry as the
    /// server does instead of applying the write twice.
    txns: HashMap<Vec<u8>, (i64, Document)>,
    /// The `host:port` this emulator announces as `me`.
    pub(crate) me: String,
    /// When set, `find` on `local.oplog.rs` fails with 13 Unauthorized, as for a user without
    /// the `find` privilege on the `local` database (common on managed clusters).
    pub(crate) deny_oplog_reads: bool,
    /// When set, `serverStatus` fails with 13 Unauthorized, as for a user without the
    /// `serverStatus` action (no `clusterMonitor`).
    pub(crate) deny_server_status: bool,
    /// One-shot: the next change stream opened without a start option starts right after this
    /// oplog position, as if the later writes committed while the server was opening it.
    pub(crate) open_at_now_after: Option<u64>,
    /// Every session's transaction, and the counters.
    pub(crate) txn: Transactions,
}

impl State {
    pub(crate) fn new(capacity: usize, me: String, txn_lifetime: std::time::Duration) -> State {
        State {
            me,
            data: Data::new(capacity),
            cursors: HashMap::new(),
            next_cursor: 7_000_000_001,
            txns: HashMap::new(),
            deny_oplog_reads: false,
            deny_server_status: false,
            open_at_now_after: None,
            txn: Transactions::new(txn_lifetime),
        }
    }

    /// The server's time: the real clock plus the test-controlled offset.
    pub(crate) fn now(&self) -> DateTime {
        self.data.now()
    }

    pub(crate) fn new_cursor_id(&mut self) -> i64 {
        self.next_cursor += 1;
        self.next_cursor
    }
}

type CmdResult = Result<Reply, CommandError>;

fn ok(d: Document) -> CmdResult {
    Ok(Reply::Doc(d))
}

fn coll_name<'a>(body: &'a Document, name: &str) -> Result<&'a str, CommandError> {
    match body.get(name) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s),
        _ => Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!(
                "collection name has invalid type {}",
                body.get(name)
                    .map_or("missing".into(), |v| format!("{:?}", v.element_type()))
            ),
        )),
    }
}

fn get_doc<'a>(body: &'a Document, key: &str) -> Result<Option<&'a Document>, CommandError> {
    match body.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d)),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "BSON field '{key}' is the wrong type, expected type 'object'"
        ))),
    }
}

fn get_docs<'a>(body: &'a Document, key: &str) -> Result<Vec<&'a Document>, CommandError> {
    match body.get(key) {
        Some(Bson::Array(items)) => items
            .iter()
            .map(|b| {
                b.as_document().ok_or_else(|| {
                    CommandError::type_mismatch(format!(
                        "BSON field '{key}' must contain documents"
                    ))
                })
            })
            .collect(),
        _ => Err(CommandError::failed_to_parse(format!(
            "BSON field '{key}' is missing but a required field"
        ))),
    }
}

fn as_i64(v: Option<&Bson>) -> Option<i64> {
    match v? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        #[allow(clippy::cast_possible_truncation)]
        Bson::Double(f) => Some(*f as i64),
        _ => None,
    }
}

fn truthy(v: Option<&Bson>) -> bool {
    match v {
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(n)) => *n != 0,
        Some(Bson::Int64(n)) => *n != 0,
        Some(Bson::Double(f)) => *f != 0.0,
        _ => false,
    }
}

fn batch_size(v: Option<&Bson>) -> Result<Option<usize>, CommandError> {
    match as_i64(v) {
        None => Ok(None),
        Some(n) if n < 0 => Err(CommandError::bad_value("batchSize must be non-negative")),
        Some(0) if v.is_some() => Ok(Some(0)),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

fn raw(d: &Document) -> Result<RawDocumentBuf, CommandError> {
    RawDocumentBuf::from_document(d)
        .map_err(|e| CommandError::new(10334, "BSONObjectTooLarge", e.to_string()))
}

fn parse_filter(body: &Document, key: &str) -> Result<Filter, CommandError> {
    match get_doc(body, key)? {
        Some(f) => Ok(Filter::parse(f)?),
        None => Ok(Filter::match_all()),
    }
}

fn txn_key(body: &Document) -> Option<(Vec<u8>, i64)> {
    let lsid = body.get_document("lsid").ok()?;
    let id = transactions::session_key(lsid.get("id")?);
    let txn = as_i64(body.get("txnNumber"))?;
    Some((id, txn))
}

/// Runs a command that completes under the lock (everything except `getMore` and `hello`).
pub(crate) fn run_sync(st: &mut State, name: &str, db: &str, body: &Document) -> CmdResult {
    transactions::expire(st);
    if let Some(args) = transactions::txn_args(body)? {
        let result = transactions::run(st, name, db, body, &args);
        st.data.publish();
        return result;
    }
    if matches!(name, "commitTransaction" | "abortTransaction") {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            format!("{name} must be run within a transaction (autocommit: false)"),
        ));
    }
    let retry = match name {
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" => txn_key(body),
        _ => None,
    };
    if let Some((key, txn)) = &retry {
        transactions::before_retryable_write(st, key, *txn)?;
        if let Some((seen, reply)) = st.txns.get(key) {
            if seen == txn {
                return ok(reply.clone());
            }
        }
    }
    let result = dispatch(st, name, db, body);
    st.data.publish();
    if let (Some((key, txn)), Ok(Reply::Doc(d))) = (retry, &result) {
        st.txns.insert(key, (txn, d.clone()));
    }
    result
}

fn dispatch(st: &mut State, name: &str, db: &str, body: &Document) -> CmdResult {
    match name {
        "ping" => ok(doc! {"ok": 1.0}),
        "buildInfo" | "buildinfo" => ok(doc! {
            "version": "0.0.0-emulator",
            "gitVersion": "none",
            "versionArray": [0, 0, 0, 0],
            "bits": 64,
            "maxBsonObjectSize": 16_777_216,
            "emulator": "flowwarden mongo-emulator: test infrastructure, not MongoDB",
            "ok": 1.0,
        }),
        "endSessions" => transactions::end_sessions(st, body),
        "killAllSessions" => {
            st.txn.abort_all("all sessions were killed");
            sync_versions(st);
            ok(doc! {"ok": 1.0})
        }
        "listDatabases" => list_databases(st, body),
        "listCollections" => list_collections(st, db, body),
        "create" => create(st, db, body),
        "collMod" => coll_mod(st, db, body),
        "drop" => drop_coll(st, db, body),
        "dropDatabase" => drop_database(st, db),
        "renameCollection" => rename(st, db, body),
        "createIndexes" => create_indexes(st, db, body),
        "listIndexes" => list_indexes(st, db, body),
        "dropIndexes" => drop_indexes(st, db, body),
        "insert" => insert(st, db, body),
        "update" => update(st, db, body),
        "delete" => delete(st, db, body),
        "find" => find(st, db, body),
        "findAndModify" | "findandmodify" => find_and_modify(st, db, body),
        "count" => count(st, db, body),
        "aggregate" => aggregate(st, db, body),
        "killCursors" => kill_cursors(st, body),
        "replSetGetStatus" => repl_status(st),
        "serverStatus" => server_status(st, body),
        other => Err(CommandError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{other}'"),
        )),
    }
}

/// Appends `operationTime` and `$clusterTime` to a reply.
pub(crate) fn finish(reply: Reply, ts: bson::Timestamp) -> Reply {
    let cluster = doc! {
        "clusterTime": ts,
        "signature": {
            "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] },
            "keyId": 0i64,
        },
    };
    match reply {
        Reply::Doc(mut d) => {
            d.insert("operationTime", ts);
            d.insert("$clusterTime", cluster);
            Reply::Doc(d)
        }
        Reply::Raw(mut r) => {
            r.append("operationTime", RawBson::Timestamp(ts));
            if let Ok(c) = RawDocumentBuf::from_document(&cluster) {
                r.append("$clusterTime", c);
            }
            Reply::Raw(r)
        }
    }
}
