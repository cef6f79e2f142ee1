//! Command handlers ("Database Commands" in the manual), run against the shared state.

use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bson::{doc, oid::ObjectId, Bson, DateTime, Document, RawBson, RawDocumentBuf};
use flowwarden::matcher::{
    compare_bson, get_path,
    update::{
        apply_pipeline_update, apply_update, is_operator_update, validate_replacement,
        UpdateChanges,
    },
    Filter, Projection,
};

use crate::changestream::{ChangeCursor, Scope, MAX_BSON};
use crate::error::CommandError;
use crate::state::{Collection, Data, Index, OpKind};

/// A reply body before `operationTime`/`$clusterTime` are added.
pub(crate) enum Reply {
    Doc(Document),
    Raw(RawDocumentBuf),
}

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
}

impl State {
    pub(crate) fn new(capacity: usize, me: String) -> State {
        State {
            me,
            data: Data::new(capacity),
            cursors: HashMap::new(),
            next_cursor: 7_000_000_001,
            txns: HashMap::new(),
            deny_oplog_reads: false,
            deny_server_status: false,
            open_at_now_after: None,
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
fn open_find_cursor(
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

fn sort_docs(docs: &mut [Arc<Document>], sort: &Document) -> Result<(), CommandError> {
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

fn matching(c: Option<&Collection>, filter: &Filter, now: DateTime) -> Vec<(u64, Arc<Document>)> {
    c.map(|c| {
        c.docs
            .iter()
            .filter(|(_, d)| filter.matches_at(d, now))
            .map(|(rid, d)| (*rid, d.clone()))
            .collect()
    })
    .unwrap_or_default()
}

fn parse_filter(body: &Document, key: &str) -> Result<Filter, CommandError> {
    match get_doc(body, key)? {
        Some(f) => Ok(Filter::parse(f)?),
        None => Ok(Filter::match_all()),
    }
}

fn dup_key_error(db: &str, coll: &str, idx: &Index, d: &Document, index: usize) -> Document {
    let kv = idx.key_value_doc(d);
    let shown: Vec<String> = kv.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    doc! {
        "index": index as i64,
        "code": 11000,
        "errmsg": format!(
            "E11000 duplicate key error collection: {db}.{coll} index: {} dup key: {{ {} }}",
            idx.name,
            shown.join(", ")
        ),
        "keyPattern": idx.key.clone(),
        "keyValue": kv,
    }
}

fn write_error(e: &CommandError, index: usize) -> Document {
    doc! {"index": index as i64, "code": e.code, "codeName": e.code_name.clone(), "errmsg": e.errmsg.clone()}
}

fn txn_key(body: &Document) -> Option<(Vec<u8>, i64)> {
    let lsid = body.get_document("lsid").ok()?;
    let id = match lsid.get("id")? {
        Bson::Binary(b) => b.bytes.clone(),
        other => crate::state::value_key(other),
    };
    let txn = as_i64(body.get("txnNumber"))?;
    Some((id, txn))
}

/// Runs a command that completes under the lock (everything except `getMore` and `hello`).
pub(crate) fn run_sync(st: &mut State, name: &str, db: &str, body: &Document) -> CmdResult {
    let retry = match name {
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" => txn_key(body),
        _ => None,
    };
    if let Some((key, txn)) = &retry {
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
        "endSessions" | "killAllSessions" => ok(doc! {"ok": 1.0}),
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

fn list_databases(st: &State, body: &Document) -> CmdResult {
    let name_only = truthy(body.get("nameOnly"));
    let filter = parse_filter(body, "filter")?;
    let dbs: Vec<Bson> = st
        .data
        .dbs
        .iter()
        .filter(|(_, colls)| !colls.is_empty())
        .map(|(name, _)| {
            if name_only {
                doc! {"name": name.clone()}
            } else {
                doc! {"name": name.clone(), "sizeOnDisk": 0i64, "empty": false}
            }
        })
        .filter(|d| filter.matches(d))
        .map(Bson::Document)
        .collect();
    ok(doc! {"databases": dbs, "totalSize": 0i64, "totalSizeMb": 0i64, "ok": 1.0})
}

fn coll_options(c: &Collection) -> Document {
    if c.images {
        doc! {"changeStreamPreAndPostImages": {"enabled": true}}
    } else {
        doc! {}
    }
}

fn list_collections(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let filter = parse_filter(body, "filter")?;
    let name_only = truthy(body.get("nameOnly"));
    let docs: Vec<Document> = st
        .data
        .dbs
        .get(db)
        .map(|colls| {
            colls
                .iter()
                .map(|(name, c)| {
                    if name_only {
                        doc! {"name": name.clone(), "type": "collection"}
                    } else {
                        doc! {
                            "name": name.clone(),
                            "type": "collection",
                            "options": coll_options(c),
                            "info": {"readOnly": false},
                            "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
                        }
                    }
                })
                .filter(|d| filter.matches(d))
                .collect()
        })
        .unwrap_or_default();
    let batch = batch_size(
        body.get_document("cursor")
            .ok()
            .and_then(|c| c.get("batchSize")),
    )?;
    open_find_cursor(st, format!("{db}.$cmd.listCollections"), docs, batch, false)
}

fn images_option(body: &Document) -> Result<Option<bool>, CommandError> {
    match body.get("changeStreamPreAndPostImages") {
        None => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(truthy(d.get("enabled")))),
        Some(_) => Err(CommandError::type_mismatch(
            "BSON field 'changeStreamPreAndPostImages' is the wrong type, expected type 'object'",
        )),
    }
}

fn create(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "create")?;
    let images = images_option(body)?.unwrap_or(false);
    if st.data.coll(db, name).is_some() {
        return Err(CommandError::new(
            48,
            "NamespaceExists",
            format!("Collection {db}.{name} already exists."),
        ));
    }
    st.data.coll_or_create(db, name).images = images;
    ok(doc! {"ok": 1.0})
}

fn coll_mod(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "collMod")?;
    let images = images_option(body)?;
    let c = st.data.coll_mut(db, name).ok_or_else(|| {
        CommandError::namespace_not_found(format!("ns does not exist: {db}.{name}"))
    })?;
    if let Some(on) = images {
        c.images = on;
    }
    ok(doc! {"ok": 1.0})
}

fn drop_coll(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "drop")?;
    let removed = st.data.dbs.get_mut(db).and_then(|colls| colls.remove(name));
    match removed {
        Some(c) => {
            st.data
                .log(db.to_string(), name.to_string(), c.images, OpKind::Drop);
            ok(
                doc! {"nIndexesWas": c.indexes.len() as i32, "ns": format!("{db}.{name}"), "ok": 1.0},
            )
        }
        None => ok(doc! {"ok": 1.0}),
    }
}

fn drop_database(st: &mut State, db: &str) -> CmdResult {
    if let Some(colls) = st.data.dbs.remove(db) {
        for (name, c) in colls {
            st.data.log(db.to_string(), name, c.images, OpKind::Drop);
        }
        st.data
            .log(db.to_string(), String::new(), false, OpKind::DropDatabase);
    }
    ok(doc! {"dropped": db, "ok": 1.0})
}

fn split_ns(ns: &str) -> Result<(&str, &str), CommandError> {
    ns.split_once('.')
        .filter(|(d, c)| !d.is_empty() && !c.is_empty())
        .ok_or_else(|| {
            CommandError::new(
                73,
                "InvalidNamespace",
                format!("Invalid namespace specified '{ns}'"),
            )
        })
}

fn rename(st: &mut State, db: &str, body: &Document) -> CmdResult {
    if db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "renameCollection may only be run against the admin database.",
        ));
    }
    let from = coll_name(body, "renameCollection")?;
    let to = body
        .get_str("to")
        .map_err(|_| CommandError::type_mismatch("BSON field 'to' must be a string"))?;
    let (fdb, fcoll) = split_ns(from)?;
    let (tdb, tcoll) = split_ns(to)?;
    if st.data.coll(fdb, fcoll).is_none() {
        return Err(CommandError::namespace_not_found(
            "source namespace does not exist",
        ));
    }
    if st.data.coll(tdb, tcoll).is_some() {
        if !truthy(body.get("dropTarget")) {
            return Err(CommandError::new(
                48,
                "NamespaceExists",
                "target namespace exists",
            ));
        }
        if let Some(c) = st.data.dbs.get_mut(tdb).and_then(|m| m.remove(tcoll)) {
            st.data
                .log(tdb.to_string(), tcoll.to_string(), c.images, OpKind::Drop);
        }
    }
    let c = st
        .data
        .dbs
        .get_mut(fdb)
        .and_then(|m| m.remove(fcoll))
        .ok_or_else(|| CommandError::namespace_not_found("source namespace does not exist"))?;
    let images = c.images;
    st.data
        .dbs
        .entry(tdb.to_string())
        .or_default()
        .insert(tcoll.to_string(), c);
    st.data.log(
        fdb.to_string(),
        fcoll.to_string(),
        images,
        OpKind::Rename {
            to_db: tdb.to_string(),
            to_coll: tcoll.to_string(),
        },
    );
    ok(doc! {"ok": 1.0})
}

fn create_indexes(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "createIndexes")?;
    let specs = get_docs(body, "indexes")?;
    let created = st.data.coll(db, name).is_none();
    let c = st.data.coll_or_create(db, name);
    let before = c.indexes.len() as i32;
    for spec in specs {
        let key = spec
            .get_document("key")
            .map_err(|_| {
                CommandError::failed_to_parse("index specification must have a 'key' document")
            })?
            .clone();
        let idx_name = spec
            .get_str("name")
            .map_err(|_| CommandError::failed_to_parse("index specification must have a 'name'"))?
            .to_string();
        if let Some(existing) = c.indexes.iter().find(|i| i.name == idx_name) {
            if existing.key != key {
                return Err(CommandError::new(86, "IndexKeySpecsConflict", format!("An existing index has the same name as the requested index but different keys: {idx_name}")));
            }
            continue;
        }
        let unique = truthy(spec.get("unique"));
        let mut full = doc! {"v": 2, "key": key.clone(), "name": idx_name.clone()};
        for (k, v) in spec {
            if !["key", "name", "v"].contains(&k.as_str()) {
                full.insert(k.clone(), v.clone());
            }
        }
        let idx = Index {
            name: idx_name,
            key,
            unique,
            spec: full,
        };
        if unique {
            let mut seen = std::collections::HashSet::new();
            for d in c.docs.values() {
                if !seen.insert(crate::state::value_key(&idx.key_of(d))) {
                    let e = dup_key_error(db, name, &idx, d, 0);
                    return Err(CommandError::new(
                        11000,
                        "DuplicateKey",
                        e.get_str("errmsg")
                            .unwrap_or("E11000 duplicate key error")
                            .to_string(),
                    ));
                }
            }
        }
        c.indexes.push(idx);
    }
    let after = c.indexes.len() as i32;
    ok(doc! {
        "numIndexesBefore": before,
        "numIndexesAfter": after,
        "createdCollectionAutomatically": created,
        "ok": 1.0,
    })
}

fn list_indexes(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "listIndexes")?;
    let c = st.data.coll(db, name).ok_or_else(|| {
        CommandError::namespace_not_found(format!("ns does not exist: {db}.{name}"))
    })?;
    let docs: Vec<Document> = c.indexes.iter().map(|i| i.spec.clone()).collect();
    let batch = batch_size(
        body.get_document("cursor")
            .ok()
            .and_then(|c| c.get("batchSize")),
    )?;
    open_find_cursor(st, format!("{db}.{name}"), docs, batch, false)
}

fn drop_indexes(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "dropIndexes")?;
    let c = st.data.coll_mut(db, name).ok_or_else(|| {
        CommandError::namespace_not_found(format!("ns does not exist: {db}.{name}"))
    })?;
    let was = c.indexes.len() as i32;
    match body.get("index") {
        Some(Bson::String(s)) if s == "*" => c.indexes.retain(|i| i.name == "_id_"),
        Some(Bson::String(s)) => {
            if s == "_id_" || !c.indexes.iter().any(|i| &i.name == s) {
                return Err(CommandError::new(
                    27,
                    "IndexNotFound",
                    format!("index not found with name [{s}]"),
                ));
            }
            c.indexes.retain(|i| &i.name != s);
        }
        Some(Bson::Document(k)) => c.indexes.retain(|i| i.name == "_id_" || &i.key != k),
        _ => {
            return Err(CommandError::type_mismatch(
                "BSON field 'index' has the wrong type",
            ))
        }
    }
    ok(doc! {"nIndexesWas": was, "ok": 1.0})
}

fn with_id(d: &Document) -> Document {
    if d.contains_key("_id") {
        return d.clone();
    }
    let mut out = Document::new();
    out.insert("_id", ObjectId::new());
    out.extend(d.clone());
    out
}

/// Inserts one document, logging the oplog entry. `index` is its place in the batch.
fn insert_one(
    st: &mut State,
    db: &str,
    coll: &str,
    d: Document,
    index: usize,
) -> Result<(), Document> {
    if let Some(Bson::Array(_)) = d.get("_id") {
        return Err(
            doc! {"index": index as i64, "code": 2, "errmsg": "can't use an array for _id"},
        );
    }
    let c = st.data.coll_or_create(db, coll);
    if let Some(idx) = c.unique_violation(&d, None) {
        return Err(dup_key_error(db, coll, idx, &d, index));
    }
    let images = c.images;
    let d = Arc::new(d);
    c.insert_record(d.clone());
    st.data.log(
        db.to_string(),
        coll.to_string(),
        images,
        OpKind::Insert { doc: d },
    );
    Ok(())
}

/// Inserts directly (test helper path), with the same checks as the `insert` command.
pub(crate) fn insert_direct(
    st: &mut State,
    db: &str,
    coll: &str,
    d: &Document,
) -> Result<(), String> {
    let r = insert_one(st, db, coll, with_id(d), 0)
        .map_err(|e| e.get_str("errmsg").unwrap_or("refused").to_string());
    st.data.publish();
    r
}

fn insert(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "insert")?;
    let docs = get_docs(body, "documents")?;
    let ordered = body.get("ordered").is_none_or(|v| truthy(Some(v)));
    let mut n = 0i32;
    let mut errors = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        match insert_one(st, db, coll, with_id(d), i) {
            Ok(()) => n += 1,
            Err(e) => {
                errors.push(Bson::Document(e));
                if ordered {
                    break;
                }
            }
        }
    }
    let mut reply = doc! {"n": n};
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    reply.insert("ok", 1.0);
    ok(reply)
}

/// The outcome of updating one matched document.
enum Updated {
    Unchanged,
    Changed,
}

/// The `u` of an update statement or the `update` of `findAndModify`.
enum UpdateArg<'a> {
    /// Operators (`{$set: ..}`) or a replacement document.
    Doc(&'a Document),
    /// A pipeline-style update (`[{$set: ..}, ..]`).
    Pipeline(Vec<Document>),
}

impl<'a> UpdateArg<'a> {
    fn from_bson(value: Option<&'a Bson>, field: &str) -> Result<Option<Self>, CommandError> {
        match value {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(UpdateArg::Doc(d))),
            Some(Bson::Array(items)) => items
                .iter()
                .map(|b| {
                    b.as_document().cloned().ok_or_else(|| {
                        CommandError::failed_to_parse(format!(
                            "BSON field '{field}' pipeline stages must be documents"
                        ))
                    })
                })
                .collect::<Result<_, _>>()
                .map(|stages| Some(UpdateArg::Pipeline(stages))),
            Some(_) => Err(CommandError::failed_to_parse(format!(
                "BSON field '{field}' must be a document or a pipeline"
            ))),
        }
    }

    /// A replacement document (rather than operators or a pipeline).
    fn is_replacement(&self) -> bool {
        matches!(self, UpdateArg::Doc(d) if !is_operator_update(d))
    }

    /// Applies it to `doc`; `is_insert` when an upsert creates the document.
    fn apply(
        &self,
        doc: &mut Document,
        is_insert: bool,
        now: DateTime,
    ) -> Result<UpdateChanges, CommandError> {
        Ok(match self {
            UpdateArg::Doc(u) => apply_update(doc, u, is_insert)?,
            UpdateArg::Pipeline(stages) => apply_pipeline_update(doc, stages, now)?,
        })
    }
}

/// Applies an update or replacement to record `rid`, logging the oplog entry.
fn update_record(
    st: &mut State,
    db: &str,
    coll: &str,
    rid: u64,
    u: &UpdateArg<'_>,
) -> Result<(Updated, Arc<Document>), CommandError> {
    let now = st.now();
    let c = st
        .data
        .coll_mut(db, coll)
        .ok_or_else(|| CommandError::namespace_not_found("collection vanished"))?;
    let old = c
        .docs
        .get(&rid)
        .cloned()
        .ok_or_else(|| CommandError::new(8, "UnknownError", "record vanished"))?;
    let mut new = (*old).clone();
    let replace = u.is_replacement();
    let changes = u.apply(&mut new, false, now)?;
    if !replace && changes.is_empty() {
        return Ok((Updated::Unchanged, old));
    }
    if replace && new == *old {
        return Ok((Updated::Unchanged, old));
    }
    if let Some(idx) = c.unique_violation(&new, Some(rid)) {
        let e = dup_key_error(db, coll, idx, &new, 0);
        return Err(CommandError::new(
            11000,
            "DuplicateKey",
            e.get_str("errmsg").unwrap_or("E11000").to_string(),
        ));
    }
    let images = c.images;
    let new = Arc::new(new);
    c.docs.insert(rid, new.clone());
    let id = new.get("_id").cloned().unwrap_or(Bson::Null);
    let pre = images.then(|| old.clone());
    let kind = if replace {
        OpKind::Replace {
            id,
            post: new.clone(),
            pre,
        }
    } else {
        OpKind::Update {
            id,
            changes: Arc::new(changes),
            post: new.clone(),
            pre,
        }
    };
    st.data.log(db.to_string(), coll.to_string(), images, kind);
    Ok((Updated::Changed, new))
}

/// Builds and inserts the document an upsert creates.
fn upsert_new(
    st: &mut State,
    db: &str,
    coll: &str,
    filter: &Filter,
    u: &UpdateArg<'_>,
) -> Result<Arc<Document>, CommandError> {
    let now = st.now();
    let mut new = if let (UpdateArg::Doc(u), true) = (u, u.is_replacement()) {
        validate_replacement(u)?;
        let mut d = (*u).clone();
        if let (None, Some(id)) = (d.get("_id"), filter.equality_seed().get("_id")) {
            d.insert("_id", id.clone());
        }
        d
    } else {
        let mut d = filter.equality_seed();
        let _: UpdateChanges = u.apply(&mut d, true, now)?;
        d
    };
    new = with_id(&new);
    if new.keys().next().map(String::as_str) != Some("_id") {
        let id = new.remove("_id").unwrap_or(Bson::Null);
        let mut d = doc! {"_id": id};
        d.extend(new);
        new = d;
    }
    let id = new.get("_id").cloned().unwrap_or(Bson::Null);
    insert_one(st, db, coll, new, 0).map_err(|e| {
        CommandError::new(
            as_i64(e.get("code"))
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(11000),
            "DuplicateKey",
            e.get_str("errmsg").unwrap_or("E11000").to_string(),
        )
    })?;
    let c = st
        .data
        .coll(db, coll)
        .ok_or_else(|| CommandError::new(8, "UnknownError", "collection vanished"))?;
    c.get_by_id(&id)
        .cloned()
        .ok_or_else(|| CommandError::new(8, "UnknownError", "upserted document vanished"))
}

fn update_spec(
    st: &mut State,
    db: &str,
    coll: &str,
    spec: &Document,
) -> Result<(i32, i32, Option<Bson>), CommandError> {
    let filter = Filter::parse(
        spec.get_document("q")
            .map_err(|_| CommandError::failed_to_parse("BSON field 'q' is missing"))?,
    )?;
    let u = UpdateArg::from_bson(spec.get("u"), "u")?
        .ok_or_else(|| CommandError::failed_to_parse("BSON field 'u' is missing"))?;
    let multi = truthy(spec.get("multi"));
    if multi && u.is_replacement() {
        return Err(CommandError::failed_to_parse(
            "multi update is not supported for replacement-style update",
        ));
    }
    let upsert = truthy(spec.get("upsert"));
    let mut targets = matching(st.data.coll(db, coll), &filter, st.now());
    if let Some(sort) = get_doc(spec, "sort")? {
        let mut docs: Vec<Arc<Document>> = targets.iter().map(|(_, d)| d.clone()).collect();
        sort_docs(&mut docs, sort)?;
        targets.sort_by_key(|(_, d)| docs.iter().position(|x| Arc::ptr_eq(x, d)));
    }
    if !multi {
        targets.truncate(1);
    }
    if targets.is_empty() {
        if upsert {
            let d = upsert_new(st, db, coll, &filter, &u)?;
            return Ok((1, 0, d.get("_id").cloned()));
        }
        return Ok((0, 0, None));
    }
    let mut n = 0;
    let mut modified = 0;
    for (rid, _) in targets {
        let (outcome, _) = update_record(st, db, coll, rid, &u)?;
        n += 1;
        if matches!(outcome, Updated::Changed) {
            modified += 1;
        }
    }
    Ok((n, modified, None))
}

fn update(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "update")?;
    let specs = get_docs(body, "updates")?;
    let ordered = body.get("ordered").is_none_or(|v| truthy(Some(v)));
    let (mut n, mut modified) = (0, 0);
    let mut upserted = Vec::new();
    let mut errors = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        match update_spec(st, db, coll, spec) {
            Ok((dn, dm, up)) => {
                n += dn;
                modified += dm;
                if let Some(id) = up {
                    upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id}));
                }
            }
            Err(e) => {
                errors.push(Bson::Document(write_error(&e, i)));
                if ordered {
                    break;
                }
            }
        }
    }
    let mut reply = doc! {"n": n, "nModified": modified};
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    reply.insert("ok", 1.0);
    ok(reply)
}

fn delete_record(st: &mut State, db: &str, coll: &str, rid: u64) -> Option<Arc<Document>> {
    let c = st.data.coll_mut(db, coll)?;
    let images = c.images;
    let old = c.remove_record(rid)?;
    let id = old.get("_id").cloned().unwrap_or(Bson::Null);
    let pre = images.then(|| old.clone());
    st.data.log(
        db.to_string(),
        coll.to_string(),
        images,
        OpKind::Delete { id, pre },
    );
    Some(old)
}

fn delete(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "delete")?;
    let specs = get_docs(body, "deletes")?;
    let mut n = 0i32;
    let mut errors = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let filter = match spec
            .get_document("q")
            .map_err(|_| CommandError::failed_to_parse("BSON field 'q' is missing"))
            .and_then(|q| Ok(Filter::parse(q)?))
        {
            Ok(f) => f,
            Err(e) => {
                errors.push(Bson::Document(write_error(&e, i)));
                break;
            }
        };
        let limit = as_i64(spec.get("limit")).unwrap_or(0);
        let mut targets = matching(st.data.coll(db, coll), &filter, st.now());
        if limit == 1 {
            targets.truncate(1);
        }
        for (rid, _) in targets {
            if delete_record(st, db, coll, rid).is_some() {
                n += 1;
            }
        }
    }
    let mut reply = doc! {"n": n};
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    reply.insert("ok", 1.0);
    ok(reply)
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

fn oplog_docs(st: &State, body: &Document) -> Result<Vec<Document>, CommandError> {
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

fn find(st: &mut State, db: &str, body: &Document) -> CmdResult {
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

fn find_and_modify(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "findAndModify")?;
    let filter = parse_filter(body, "query")?;
    let fields = get_doc(body, "fields")?
        .map(Projection::parse)
        .transpose()?;
    let remove = truthy(body.get("remove"));
    let return_new = truthy(body.get("new"));
    let upsert = truthy(body.get("upsert"));
    let update = UpdateArg::from_bson(body.get("update"), "update")?;
    if remove == update.is_some() {
        return Err(CommandError::failed_to_parse(
            "Either an update or remove=true must be specified",
        ));
    }
    let mut targets: Vec<(u64, Arc<Document>)> =
        matching(st.data.coll(db, coll), &filter, st.now());
    if let Some(sort) = get_doc(body, "sort")? {
        let mut docs: Vec<Arc<Document>> = targets.iter().map(|(_, d)| d.clone()).collect();
        sort_docs(&mut docs, sort)?;
        targets.sort_by_key(|(_, d)| docs.iter().position(|x| Arc::ptr_eq(x, d)));
    }
    let project = |d: &Document| -> Bson {
        Bson::Document(match &fields {
            Some(p) => p.apply(d),
            None => d.clone(),
        })
    };
    let target = targets.into_iter().next();
    let (value, last_error) = match (target, update) {
        (Some((rid, old)), None) => {
            delete_record(st, db, coll, rid);
            (project(&old), doc! {"n": 1})
        }
        (None, None) => (Bson::Null, doc! {"n": 0}),
        (Some((rid, old)), Some(u)) => {
            let (_, new) = update_record(st, db, coll, rid, &u)?;
            let shown = if return_new {
                project(&new)
            } else {
                project(&old)
            };
            (shown, doc! {"n": 1, "updatedExisting": true})
        }
        (None, Some(u)) if upsert => {
            let new = upsert_new(st, db, coll, &filter, &u)?;
            let shown = if return_new {
                project(&new)
            } else {
                Bson::Null
            };
            let id = new.get("_id").cloned().unwrap_or(Bson::Null);
            (
                shown,
                doc! {"n": 1, "updatedExisting": false, "upserted": id},
            )
        }
        (None, Some(_)) => (Bson::Null, doc! {"n": 0, "updatedExisting": false}),
    };
    ok(doc! {"lastErrorObject": last_error, "value": value, "ok": 1.0})
}

fn count(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let coll = coll_name(body, "count")?;
    let n = query(st, db, coll, body, "query")?.len();
    ok(doc! {"n": i64::try_from(n).unwrap_or(i64::MAX), "ok": 1.0})
}

fn kill_cursors(st: &mut State, body: &Document) -> CmdResult {
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

fn repl_status(st: &mut State) -> CmdResult {
    let d = &st.data;
    let head = d.oplog.back();
    let optime = doc! {"ts": d.head_ts, "t": 1i64};
    let wall = head.map_or_else(bson::DateTime::now, |e| e.wall);
    let mut reply = doc! {
        "set": "rs0",
        "date": bson::DateTime::now(),
        "myState": 1,
        "term": 1i64,
        "members": [{
            "_id": 0,
            "name": st.me.clone(),
            "health": 1.0,
            "state": 1,
            "stateStr": "PRIMARY",
            "optime": optime.clone(),
            "optimeDate": wall,
            "self": true,
        }],
        "optimes": {
            "lastCommittedOpTime": optime.clone(),
            "appliedOpTime": optime.clone(),
            "durableOpTime": optime,
        },
    };
    if let Some(first) = d.oplog.front() {
        reply.insert(
            "oldestOplogEntry",
            doc! {"ts": first.ts, "wall": first.wall},
        );
    }
    reply.insert("ok", 1.0);
    ok(reply)
}

/// `serverStatus`: a few identifying fields, and with `oplog: 1` the `oplog` section
/// (`latestOptime`, `earliestOptime`) that a real `mongod` returns only when asked for it.
fn server_status(st: &State, body: &Document) -> CmdResult {
    if st.deny_server_status {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "not authorized on admin to execute command { serverStatus: 1 }",
        ));
    }
    let d = &st.data;
    let mut reply = doc! {
        "host": st.me.clone(),
        "version": "0.0.0-emulator",
        "process": "mongod",
        "localTime": st.now(),
    };
    if truthy(body.get("oplog")) {
        let mut oplog = doc! {"latestOptime": d.head_ts};
        if let Some(first) = d.oplog.front() {
            oplog.insert("earliestOptime", first.ts);
        }
        reply.insert("oplog", oplog);
    }
    reply.insert("ok", 1.0);
    ok(reply)
}

fn aggregate(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let stages: Vec<Document> = get_docs(body, "pipeline")?.into_iter().cloned().collect();
    let cursor_opts =
        match body.get("cursor") {
            Some(Bson::Document(c)) => c.clone(),
            _ if truthy(body.get("explain")) => doc! {},
            _ => return Err(CommandError::failed_to_parse(
                "The 'cursor' option is required, except for aggregate with the explain argument",
            )),
        };
    let batch = batch_size(cursor_opts.get("batchSize"))?;
    let target = body.get("aggregate");
    if let Some(spec) = stages.first().and_then(|s| s.get("$changeStream")) {
        let spec = spec
            .as_document()
            .ok_or_else(|| CommandError::type_mismatch("$changeStream must take an object"))?;
        let (scope, ns) = match target {
            Some(Bson::String(coll)) => {
                if ["admin", "config", "local"].contains(&db) {
                    return Err(CommandError::new(
                        73,
                        "InvalidNamespace",
                        format!("$changeStream may not be opened on the internal {db} database"),
                    ));
                }
                (
                    Scope::Coll(db.to_string(), coll.clone()),
                    format!("{db}.{coll}"),
                )
            }
            Some(t) if as_i64(Some(t)) == Some(1) => {
                if truthy(spec.get("allChangesForCluster")) {
                    (Scope::Cluster, format!("{db}.$cmd.aggregate"))
                } else if ["admin", "config", "local"].contains(&db) {
                    return Err(CommandError::new(
                        73,
                        "InvalidNamespace",
                        format!("$changeStream may not be opened on the internal {db} database"),
                    ));
                } else {
                    (Scope::Db(db.to_string()), format!("{db}.$cmd.aggregate"))
                }
            }
            _ => {
                return Err(CommandError::type_mismatch(
                    "aggregate must be a collection name or 1",
                ))
            }
        };
        let opened_at_now = !["resumeAfter", "startAfter", "startAtOperationTime"]
            .iter()
            .any(|k| spec.contains_key(*k));
        let mut cursor = ChangeCursor::open(&st.data, scope, ns.clone(), spec, &stages[1..])?;
        if opened_at_now {
            if let Some(pos) = st.open_at_now_after.take() {
                cursor.start_after(&st.data, pos);
            }
        }
        let first = cursor.read(&st.data, batch.unwrap_or(101))?;
        let id = if cursor.closed { 0 } else { st.new_cursor_id() };
        let pbrt = cursor.pbrt.clone();
        if !cursor.closed {
            st.cursors.insert(id, Cursor::Change(Box::new(cursor)));
        }
        return cursor_reply(id, &ns, true, first.events, Some(&pbrt));
    }
    if stages
        .iter()
        .skip(1)
        .any(|s| s.contains_key("$changeStream"))
    {
        return Err(CommandError::new(
            40602,
            "Location40602",
            "$changeStream is only valid as the first stage in a pipeline",
        ));
    }
    let coll = match target {
        Some(Bson::String(c)) => c.clone(),
        _ => {
            return Err(CommandError::new(
                59,
                "CommandNotFound",
                "collection-less aggregate stages are not emulated",
            ))
        }
    };
    let mut docs: Vec<Document> = st
        .data
        .coll(db, &coll)
        .map(|c| c.docs.values().map(|d| (**d).clone()).collect())
        .unwrap_or_default();
    for stage in &stages {
        docs = run_stage(stage, docs)?;
    }
    open_find_cursor(st, format!("{db}.{coll}"), docs, batch, false)
}

fn run_stage(stage: &Document, docs: Vec<Document>) -> Result<Vec<Document>, CommandError> {
    let Some((name, arg)) = stage.iter().next().filter(|_| stage.len() == 1) else {
        return Err(CommandError::new(
            40323,
            "Location40323",
            "A pipeline stage specification object must contain exactly one field.",
        ));
    };
    let arg_doc = || {
        arg.as_document()
            .ok_or_else(|| CommandError::type_mismatch(format!("{name} must take an object")))
    };
    let arg_n = || {
        as_i64(Some(arg))
            .filter(|n| *n >= 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| CommandError::bad_value(format!("invalid argument to {name} stage")))
    };
    Ok(match name.as_str() {
        "$match" => {
            let f = Filter::parse(arg_doc()?)?;
            docs.into_iter().filter(|d| f.matches(d)).collect()
        }
        "$sort" => {
            let mut arcs: Vec<Arc<Document>> = docs.into_iter().map(Arc::new).collect();
            sort_docs(&mut arcs, arg_doc()?)?;
            arcs.into_iter()
                .map(|a| Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()))
                .collect()
        }
        "$skip" => docs.into_iter().skip(arg_n()?).collect(),
        "$limit" => docs.into_iter().take(arg_n()?).collect(),
        "$project" => {
            let p = Projection::parse(arg_doc()?)?;
            docs.iter().map(|d| p.apply(d)).collect()
        }
        "$count" => {
            let field = arg
                .as_str()
                .ok_or_else(|| CommandError::type_mismatch("$count must take a string"))?;
            if docs.is_empty() {
                Vec::new()
            } else {
                vec![doc! {field: i32::try_from(docs.len()).unwrap_or(i32::MAX)}]
            }
        }
        "$group" => group(arg_doc()?, docs)?,
        other => {
            return Err(CommandError::new(
                40324,
                "Location40324",
                format!("Unrecognized pipeline stage name: '{other}' (not emulated)"),
            ))
        }
    })
}

fn group(spec: &Document, docs: Vec<Document>) -> Result<Vec<Document>, CommandError> {
    let key_expr = spec.get("_id").ok_or_else(|| {
        CommandError::new(
            15955,
            "Location15955",
            "a group specification must include an _id",
        )
    })?;
    let eval = |e: &Bson, d: &Document| -> Bson {
        match e {
            Bson::String(s) if s.starts_with('$') => {
                get_path(d, &s[1..]).cloned().unwrap_or(Bson::Null)
            }
            other => other.clone(),
        }
    };
    let mut accs = Vec::new();
    for (field, acc) in spec.iter().filter(|(k, _)| *k != "_id") {
        let acc = acc.as_document().filter(|a| a.len() == 1).ok_or_else(|| {
            CommandError::new(
                40234,
                "Location40234",
                format!("The field '{field}' must be an accumulator object"),
            )
        })?;
        let (op, arg) = acc
            .iter()
            .next()
            .ok_or_else(|| CommandError::bad_value("empty accumulator"))?;
        if op != "$sum" {
            return Err(CommandError::new(
                15952,
                "Location15952",
                format!("unknown group operator '{op}' (only $sum is emulated)"),
            ));
        }
        accs.push((field.clone(), arg.clone()));
    }
    let mut groups: Vec<(Bson, Vec<Bson>)> = Vec::new();
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    for d in &docs {
        let key = eval(key_expr, d);
        let slot = *index
            .entry(crate::state::value_key(&key))
            .or_insert_with(|| {
                groups.push((key.clone(), vec![Bson::Int32(0); accs.len()]));
                groups.len() - 1
            });
        for (i, (_, arg)) in accs.iter().enumerate() {
            let v = eval(arg, d);
            let total = &mut groups[slot].1[i];
            *total = add_numbers(total, &v);
        }
    }
    Ok(groups
        .into_iter()
        .map(|(key, totals)| {
            let mut out = doc! {"_id": key};
            for ((field, _), t) in accs.iter().zip(totals) {
                out.insert(field.clone(), t);
            }
            out
        })
        .collect())
}

fn add_numbers(a: &Bson, b: &Bson) -> Bson {
    match (a, b) {
        (Bson::Int32(x), Bson::Int32(y)) => x
            .checked_add(*y)
            .map_or(Bson::Int64(i64::from(*x) + i64::from(*y)), Bson::Int32),
        (Bson::Int32(x), Bson::Int64(y)) | (Bson::Int64(y), Bson::Int32(x)) => {
            Bson::Int64(i64::from(*x).saturating_add(*y))
        }
        (Bson::Int64(x), Bson::Int64(y)) => Bson::Int64(x.saturating_add(*y)),
        #[allow(clippy::cast_precision_loss)]
        (Bson::Double(x), Bson::Int64(y)) | (Bson::Int64(y), Bson::Double(x)) => {
            Bson::Double(x + *y as f64)
        }
        (Bson::Double(x), Bson::Int32(y)) | (Bson::Int32(y), Bson::Double(x)) => {
            Bson::Double(x + f64::from(*y))
        }
        (Bson::Double(x), Bson::Double(y)) => Bson::Double(x + y),
        _ => a.clone(),
    }
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
