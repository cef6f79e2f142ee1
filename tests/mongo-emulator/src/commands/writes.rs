//! Writes: `insert`, `update` (with upserts and pipeline updates), `delete` and
//! `findAndModify`, each logging its oplog entries, and the write errors they report.

use std::sync::Arc;

use bson::{doc, oid::ObjectId, Bson, DateTime, Document};
use flowwarden::matcher::{
    update::{
        apply_pipeline_update, apply_update, is_operator_update, validate_replacement,
        UpdateChanges,
    },
    Filter, Projection,
};

use super::queries::{matching, sort_docs};
use super::{as_i64, coll_name, get_doc, get_docs, ok, parse_filter, truthy, CmdResult, State};
use crate::error::CommandError;
use crate::state::{Index, OpKind};

pub(super) fn dup_key_error(
    db: &str,
    coll: &str,
    idx: &Index,
    d: &Document,
    index: usize,
) -> Document {
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

pub(super) fn insert(st: &mut State, db: &str, body: &Document) -> CmdResult {
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

pub(super) fn update(st: &mut State, db: &str, body: &Document) -> CmdResult {
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

pub(super) fn delete(st: &mut State, db: &str, body: &Document) -> CmdResult {
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

pub(super) fn find_and_modify(st: &mut State, db: &str, body: &Document) -> CmdResult {
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
