//! Indexes: `createIndexes` (checking unique ones against the documents already stored),
//! `listIndexes` and `dropIndexes`.

use bson::{doc, Bson, Document};

use super::cursors::open_find_cursor;
use super::writes::dup_key_error;
use super::{batch_size, coll_name, get_docs, ok, truthy, CmdResult, State};
use crate::error::CommandError;
use crate::state::Index;

pub(super) fn create_indexes(st: &mut State, db: &str, body: &Document) -> CmdResult {
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

pub(super) fn list_indexes(st: &mut State, db: &str, body: &Document) -> CmdResult {
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

pub(super) fn drop_indexes(st: &mut State, db: &str, body: &Document) -> CmdResult {
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
